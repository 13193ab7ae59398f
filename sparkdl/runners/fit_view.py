"""One fit's view of a runner that several fits share (driver side).

A pass (:mod:`sparkdl.engine.fit_set`) trains several fits on one runner and one copy of their
data. Each fit's loop, validation, recovery and checkpoints talk to a :class:`FitView`: the
runner protocol (:class:`sparkdl.runners.interface.IterationRunner`) for that fit alone. Its
``load`` holds a data object once for the whole pass (the views share a cache); ``start`` adds
the fit to the runner (``add_fit``) where the runner can run several fits' iterations in one job
(``gradients_together``), else it is the runner's own ``start``.

Example::

    loads = {}
    view = FitView(runner, loads)
    train = view.load(rdd, "training", "float32")      # built once for every view of ``loads``
    view.start(spec, layout, options, train)
    result = view.gradients(train, step, weights)      # this fit's AllReduceResult
"""

from __future__ import annotations

from typing import Any

from ..errors import SparkdlError
from ..transport.allreduce import AllReduceResult
from .executor_imports import executor_import_error, missing_sparkdl_reason

__all__ = ["FitView", "shares_passes"]


def shares_passes(runner: Any) -> bool:
    """Whether ``runner`` can run several fits' iterations in one job
    (:class:`sparkdl.runners.interface.PassRunner`)."""
    return hasattr(runner, "gradients_together")


class FitView:
    """One fit's view of a runner shared by a pass: the runner protocol
    (:class:`sparkdl.runners.interface.IterationRunner`) for that fit alone, data loaded once
    for the whole pass."""

    def __init__(self, runner: Any, loads: dict[tuple[Any, ...], Any] | None = None) -> None:
        self.runner = runner
        self.fit: int | None = None
        self._loads = loads if loads is not None else {}

    @property
    def spark_context(self) -> Any:
        return self.runner.spark_context

    def task_cores(self) -> int:
        return self.runner.task_cores()

    def schedules_gpus(self) -> bool:
        return self.runner.schedules_gpus()

    def check_device(self, device: str) -> None:
        self.runner.check_device(device)

    def load(self, data: Any, name: str, float_dtype: str, ragged: tuple[int, ...] = ()) -> Any:
        """``data`` held for the tasks: once per pass for the same data object and form."""
        key = (id(data), name, float_dtype, tuple(ragged))
        if key not in self._loads:
            try:
                held = self.runner.load(data, name, float_dtype, ragged)
            except SparkdlError:
                raise
            except Exception as exc:     # the first job of a fit: executors import sparkdl
                line = missing_sparkdl_reason(exc)
                if line is None:
                    raise
                raise executor_import_error(f"building the {name} shards", line) from exc
            self._loads[key] = (data, held)
        return self._loads[key][1]

    def start(self, spec: Any, layout: Any, options: Any, train: Any) -> str:
        if not shares_passes(self.runner):
            return self.runner.start(spec, layout, options, train)
        self.fit, how = self.runner.add_fit(spec, layout, options, train)
        return how

    def gradients(self, data: Any, step: Any, weights: Any) -> AllReduceResult:
        if self.fit is None:
            return self.runner.gradients(data, step, weights)
        return self.runner.gradients_together(data, [(self.fit, step, weights)])[0]

    def evaluate(self, data: Any, weights: Any, metrics: Any, batch_size: int) -> Any:
        if self.fit is None:
            return self.runner.evaluate(data, weights, metrics, batch_size)
        return self.runner.evaluate(data, weights, metrics, batch_size, fit=self.fit)

    def lost_data_reason(self, exc: BaseException) -> str | None:
        return self.runner.lost_data_reason(exc)

    def memory_kill_reason(self, exc: BaseException) -> str | None:
        return self.runner.memory_kill_reason(exc)

    def driver_failure(self, exc: BaseException) -> str | None:
        return self.runner.driver_failure(exc)

    def rebuild(self, data: Any, reason: str) -> None:
        self.runner.rebuild(data, reason)

    def close(self) -> None:
        """Release this fit (its data and the runner stay with the pass)."""
        if self.fit is not None:
            self.runner.close_fit(self.fit)
            self.fit = None
