"""Validation during training: the job, its recovery, and the record (driver side).

The runner computes per-partition metric sums on the validation shards
(:meth:`IterationRunner.evaluate`); here they are added in partition order and turned into the
metrics (:mod:`sparkdl.metrics`). A partition whose shard was lost is rebuilt and the job re-run
(:func:`sparkdl.engine.fit.recovery.run_with_recovery`), so a metric always covers every sample.

Example::

    validation = Validation(val_data, EveryEpoch(), [Top1Accuracy(), Loss()], batch_size=1024)
    record = validation.run(ctx, weights, state)     # a ValidationRecord, also in ctx.summary
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import raise_reported
from ...metrics import ValidationMetric, threshold_warning
from ...triggers import TrainingState, Trigger
from .recovery import run_with_recovery
from .run_context import RunContext
from ...runners.held_data import not_found
from ...runners.interface import DataHandle, PartitionMetrics
from .reports.summary import ValidationRecord

__all__ = ["Validation"]

log = logging.getLogger("sparkdl")


@dataclass
class Validation:
    """What :meth:`sparkdl.DistriOptimizer.set_validation` asked for; ``held`` is the data once
    the runner holds it."""

    data: Any
    trigger: Trigger
    metrics: list[ValidationMetric]
    batch_size: int
    held: DataHandle | None = None

    def warn_about_threshold(self, ctx: RunContext) -> None:
        """Warn, once at the start of a run, when the accuracy's default threshold is likely
        wrong for the model and the loss (:func:`sparkdl.metrics.threshold_warning`)."""
        warning = threshold_warning(self.metrics, ctx.model, ctx.criterion)
        if warning is not None:
            log.warning("%s", warning)

    def run(self, ctx: RunContext, weights: np.ndarray, state: TrainingState
            ) -> ValidationRecord:
        """Evaluate the metrics with ``weights``; the record is appended to ``ctx.summary``."""
        held = self.held
        assert held is not None

        def missing(results: list[PartitionMetrics]) -> list[int]:
            return [r.partition for r in results if not_found(r, held)]

        what = f"the validation after iteration {state.iteration}"
        results = run_with_recovery(
            ctx.runner, held,
            lambda: ctx.runner.evaluate(held, weights, self.metrics, self.batch_size),
            missing, what)
        raise_reported(results, what)    # a permanent error a task reported, as itself
        values: dict[str, float] = {}
        for m, metric in enumerate(self.metrics):
            parts = [r.sums[m] for r in results if r.sums is not None and r.count > 0]
            total = np.sum(parts, axis=0) if parts else np.zeros(2)
            values[metric.name] = metric.result(total)
        record = ValidationRecord(state.iteration, state.epoch, values)
        ctx.summary.validations.append(record)
        log.info("validation after iteration %d (epoch %d): %s", state.iteration, state.epoch,
                 ", ".join(f"{k} {v:.6g}" for k, v in values.items()))
        return record
