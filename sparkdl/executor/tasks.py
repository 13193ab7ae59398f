"""The functions Spark runs in its Python workers, as small picklable objects (executor side).

Each class here is what one kind of job ships to its tasks: instances pickle as a reference to
this importable module plus a few small fields (keys, the iteration's :class:`StepSpec`,
broadcast handles), never as copies of module state. They connect Spark's task context (the
partition index, the attempt number, the task's cores) to the plain computations of
:mod:`sparkdl.executor.step`, the replica cache and the shard store.

Every kind (gradient, validation, shard build, fill) reports a permanent sparkdl error in its
result instead of raising it (:func:`sparkdl.errors.permanent_report`): the task succeeds, Spark
does not retry what cannot succeed, and the driver raises the same class with the same message.

Example::

    task = GradientTask(run_key, data_key, step, spec_broadcast, refresh)
    allreduce.run(index_rdd, task)          # task(partition, summary) -> (vector, report)
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import SparkdlError, permanent_report
from ..metrics import ValidationMetric
from ..transport.segmented_vector import copy_vector_into
from ..transport.tensor_buffers import OutOfBand
from ..transport.weight_refresh import Refresh
from .devices import task_device
from .executor_identity import executor_location
from .live_runs import LiveRuns, evict_finished
from .replicas import Replica, drop_replica, get_replica
from .shard_store import ShardSummary, build_shard, drop_run, open_shard
from .worker_cache import freeze_long_lived, one_freeze
from .step import (PartitionMetrics, StepSpec, TaskReport, compute_gradient,
                   compute_metric_sums, set_task_threads)

__all__ = ["task_attempt", "PickledSpec", "GradientTask", "PassGradientTask", "PassReport", "EvaluationTask",
           "ShardBuildTask", "CleanupTask", "FillTask", "FillMapTask"]


class PickledSpec:
    """A broadcast of cloudpickled bytes, or of an
    :class:`~sparkdl.transport.tensor_buffers.OutOfBand` pickle, read as the object it holds
    (the replica spec may name classes that only cloudpickle can ship, e.g. defined in
    ``__main__``)."""

    def __init__(self, broadcast: Any) -> None:
        self.broadcast = broadcast

    @property
    def value(self) -> Any:
        shipped = self.broadcast.value
        spec = shipped.load() if isinstance(shipped, OutOfBand) else pickle.loads(shipped)
        del shipped
        forget = getattr(self.broadcast, "forget", None)
        if forget is not None:      # the bytes of a large model, no longer wanted in the task
            forget()
        return spec


def task_attempt() -> int:
    """The running Spark task's attempt number (0 outside a task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


@dataclass
class GradientTask:
    """One iteration's map side: ``(partition, summary) -> (vector or None, TaskReport)``."""

    run_key: str
    data_key: str
    step: StepSpec
    spec: Any            # broadcast of the cloudpickled ReplicaSpec
    weights: Any         # the weights' Refresh (sparkdl.transport.weight_refresh), or a
    # broadcast of the whole state
    live: LiveRuns | None = None   # the driver's live runs: the worker evicts the others'

    def __call__(self, partition: int, summary: Any) -> tuple[np.ndarray | None, TaskReport]:
        evict_finished(self.live)
        return self.compute(partition, open_shard(self.data_key, partition)
                            if int(self.step.counts[partition]) else None)

    def compute(self, partition: int, shard: Any) -> tuple[np.ndarray | None, TaskReport]:
        """The step on ``shard`` (None: not here, reported as a missing shard). A permanent
        sparkdl error (:attr:`sparkdl.errors.SparkdlError.permanent`) is reported, not raised:
        the task succeeds, Spark does not retry what cannot succeed, and the driver raises it."""
        try:
            set_task_threads(self.step.sub_replicas)
            choice = task_device(self.step.device)

            def replica(sub: int) -> Replica:
                return get_replica(self.run_key, PickledSpec(self.spec), choice.device, sub)

            weights = self.weights if isinstance(self.weights, Refresh) else self.weights.value
            vector, report = compute_gradient(self.step, partition, shard, replica, weights,
                                              attempt=task_attempt(), device=choice.device)
        except SparkdlError as exc:
            fatal = permanent_report(exc)
            if fatal is None:
                raise
            return None, TaskReport(partition=partition, attempt=task_attempt(), fatal=fatal)
        report.device = f"{choice.device} ({choice.reason})"
        report.executor = executor_location()
        return vector, report


@dataclass
class PassReport:
    """A pass's task report (:class:`PassGradientTask`): each fit's own :class:`TaskReport`,
    in the pass's order, and what the AllReduce and the repair loop read of a task."""

    partition: int
    fits: list[TaskReport]
    absent: tuple[tuple[int, int], ...] = ()
    """The ranges of the pass's vector whose fit took no rows here (their zeros are not
    added: :func:`sparkdl.transport.allreduce.sum_in_order`)."""
    attempt: int = 0
    missing_shard: bool = False
    started_at: float = 0.0
    finished_at: float = 0.0
    full_read: bool = False
    executor: str = ""
    fatal: tuple[str, str] | None = None
    table_rows: dict[tuple[int, int], Any] | None = None
    """Every fit's embedding tables' rows, keyed ``(fit, parameter)`` (taken out of the fits'
    reports: the shuffle sums them by block like a single fit's,
    :func:`sparkdl.transport.pass_results.split_pass_result` gives each fit its own)."""


@dataclass
class PassGradientTask:
    """One iteration of a pass (several fits over one data set, :mod:`sparkdl.engine.fit_set`):
    every fit's :class:`GradientTask` on the partition's shard, opened once, their vectors one
    after another (``sizes``: each fit's vector length; a fit without rows here leaves zeros
    that the AllReduce skips), and a :class:`PassReport`."""

    data_key: str
    fits: list[GradientTask]
    sizes: list[int]
    dtype: str
    live: LiveRuns | None = None

    def __call__(self, partition: int, summary: Any) -> tuple[np.ndarray | None, PassReport]:
        evict_finished(self.live)
        wanted = any(int(fit.step.counts[partition]) for fit in self.fits)
        with one_freeze():             # the first iteration makes a replica per fit
            return self.compute(partition, open_shard(self.data_key, partition) if wanted
                                else None)

    def compute(self, partition: int, shard: Any) -> tuple[np.ndarray | None, PassReport]:
        """Every fit's step on ``shard`` (None: not here, reported as a missing shard by each
        fit that has rows here)."""
        results = [fit.compute(partition, shard) for fit in self.fits]
        rows = {(k, p): values for k, (_, r) in enumerate(results)
                for p, values in (r.table_rows or {}).items()}
        reports = [dataclasses.replace(r, table_rows=None) if r.table_rows else r
                   for _, r in results]
        report = PassReport(partition, reports, attempt=task_attempt(), table_rows=rows or None,
                            missing_shard=any(r.missing_shard for r in reports),
                            started_at=min((r.started_at for r in reports), default=0.0),
                            finished_at=max((r.finished_at for r in reports), default=0.0),
                            full_read=any(r.full_read for r in reports),
                            executor=executor_location())
        bounds = np.concatenate([[0], np.cumsum(self.sizes)]).tolist()
        report.absent = tuple((bounds[k], bounds[k + 1]) for k, (part, _) in enumerate(results)
                              if part is None)
        if all(part is None for part, _ in results):
            return None, report
        vector = np.zeros(bounds[-1], dtype=self.dtype)
        for k, (part, _) in enumerate(results):
            if part is not None:
                copy_vector_into(vector[bounds[k]:bounds[k + 1]], part)
        return vector, report


@dataclass
class EvaluationTask:
    """A validation job's function for ``mapPartitionsWithIndex``: yields
    ``(partition, metric sums or None, sample count)``."""

    run_key: str
    data_key: str
    spec: Any
    weights: Any
    metrics: Sequence[ValidationMetric]
    batch_size: int
    device: str = "cpu"
    precision: str = "32"
    live: LiveRuns | None = None

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[PartitionMetrics]:
        evict_finished(self.live)
        for _ in records:
            pass
        yield self.compute(partition, open_shard(self.data_key, partition))

    def compute(self, partition: int, shard: Any) -> PartitionMetrics:
        """The metric sums on ``shard`` (None: not here, sums None). A permanent sparkdl error
        is reported in ``fatal``, not raised, as in :meth:`GradientTask.compute`."""
        if shard is None:
            return PartitionMetrics(partition, None, 0)
        try:
            set_task_threads()
            replica = get_replica(self.run_key, PickledSpec(self.spec),
                                  task_device(self.device).device)
            sums, count = compute_metric_sums(shard, replica, self.weights.value, self.metrics,
                                              self.batch_size, self.precision, partition)
        except SparkdlError as exc:
            fatal = permanent_report(exc)
            if fatal is None:
                raise
            return PartitionMetrics(partition, None, 0, fatal)
        return PartitionMetrics(partition, sums, count)


@dataclass
class ShardBuildTask:
    """The build job's function: converts a partition into a shard, yields its summary (bad
    records and permanent sparkdl errors reported in it: :func:`build_shard`)."""

    data_key: str
    float_dtype: str
    place: str = "disk"
    ragged: tuple[int, ...] = ()
    live: LiveRuns | None = None

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[ShardSummary]:
        evict_finished(self.live)
        yield build_shard(self.data_key, partition, records, self.float_dtype, self.place,
                          self.ragged)


@dataclass
class FillTask:
    """A fill job's function over the *input* RDD, for partitions whose task found no shard
    where it ran: builds the shard where this task runs (so later jobs there find it), then
    computes what ``task`` (a :class:`GradientTask` or :class:`EvaluationTask`) computes on it.
    Yields ``(summary, task.compute(partition, shard))``; both report permanent errors, so a
    fill task never fails for one."""

    build: ShardBuildTask
    task: Any

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[Any]:
        yield self.filled(partition, records)

    def filled(self, partition: int, records: Iterator[Any]) -> tuple[ShardSummary, Any]:
        """``partition``'s shard built from ``records`` here, and ``task.compute`` on it."""
        summary = next(self.build(partition, records))
        shard = open_shard(self.build.data_key, partition) if summary.error is None else None
        return summary, self.task.compute(partition, shard)


@dataclass
class FillMapTask:
    """A fill job's map task on the shuffle AllReduce's path
    (:mod:`sparkdl.transport.filled_blocks`), over the input RDD cut to the missing
    partitions: task ``i`` builds partition ``partitions[i]``'s shard where it runs (from the
    user's Python functions ``lineage`` over the records, when the RDD has them), computes
    ``task``'s vector on it and emits it as the run's map tasks do, with the shard's summary
    (``side``: :meth:`sparkdl.transport.allreduce.ShuffleAllReduce.fill_side`)."""

    fill: FillTask
    partitions: list[int]
    side: Any
    lineage: Callable[[int, Iterator[Any]], Iterator[Any]] | None = None

    def __call__(self, index: int, records: Iterator[Any]) -> Iterator[Any]:
        partition = self.partitions[index]
        rows = records if self.lineage is None else self.lineage(partition, records)
        summary, (vector, report) = self.fill.filled(partition, rows)
        yield from self.side.emit(partition, vector, report, summary)


@dataclass
class CleanupTask:
    """Drops the shards and replicas of the given keys in whichever worker runs it, then
    freezes what is left (:func:`~sparkdl.executor.worker_cache.freeze_long_lived`: one walk
    now, none in the next fit's first task)."""

    keys: list[str]

    def __call__(self, _: Any) -> list[Any]:
        for key in self.keys:
            drop_run(key)
            drop_replica(key)
        freeze_long_lived()
        return []
