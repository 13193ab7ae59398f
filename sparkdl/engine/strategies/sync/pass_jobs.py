"""Several fits' SGD loops run as one sequence of iterations, one gradient job each (driver
side).

:class:`PassLoop` drives the :class:`sparkdl.engine.strategies.sync.step.TrainingLoop` of every fit of a
pass (:mod:`sparkdl.engine.fit_set`): each iteration it asks every active loop for its step and
weights (``request``), runs one job for all of them (the runner's ``gradients_together``, with
the same recovery as a single fit's job), and hands each loop its own result (``complete``). A
loop whose end trigger fires leaves; the others go on. A pass of one loop is a single fit's run.

Example::

    PassLoop([TrainingLoop(ctx_a), TrainingLoop(ctx_b)]).run()
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from ....transport.allreduce import AllReduceResult
from ...fit.recovery import run_with_recovery

__all__ = ["PassLoop"]

log = logging.getLogger("sparkdl")


class PassLoop:
    """Runs the loops (:class:`sparkdl.engine.strategies.sync.step.TrainingLoop`) of fits that share a
    runner and training data as one sequence of iterations, one job each, until every fit's end
    trigger fired. ``keep_going``: a fit that fails leaves the pass with its error kept in
    :attr:`errors` (by its position) and the others go on; else the error is raised at once."""

    def __init__(self, loops: Sequence[Any], keep_going: bool = False) -> None:
        self.loops = list(loops)
        self.keep_going = keep_going
        self.errors: dict[int, BaseException] = {}
        self.finished: set[int] = set()
        """The loops that reached their end trigger."""
        self.jobs = 0

    word = "pass"
    """How the log names what the fits share."""

    def run(self) -> None:
        active: list[int] = []
        try:
            for k, loop in enumerate(self.loops):
                if self._guarded(k, loop.start):
                    active.append(k)
                elif k not in self.errors:
                    self.finished.add(k)
            self._starting(active)
            while active:
                completions = self._iteration(active)
                still, left = [], []
                for k in active:
                    ended = self._guarded(k, completions[k])
                    if k in self.errors:
                        continue
                    if not ended:
                        still.append(k)
                        continue
                    self.loops[k].close()
                    self.finished.add(k)
                    left.append(k)
                if left and len(self.loops) > 1:
                    log.info("fits %s leave the %s after their iteration %s (%d fits go on)",
                             left, self.word, [self.loops[k].ctx.iteration for k in left],
                             len(still))
                active = still
        finally:
            for k in active:
                self.loops[k].close()

    def _starting(self, active: list[int]) -> None:
        """Before the first job, with the fits that train (a hook)."""

    def _iteration(self, active: list[int]) -> dict[int, Callable[[], bool]]:
        """One job for the active fits; each fit's completion of it (True: the fit ended)."""
        requests = [self.loops[k].request() for k in active]
        results = self._job(active, requests)
        return {k: (lambda k=k, result=result: self.loops[k].complete(result))
                for k, result in zip(active, results)}

    def _guarded(self, k: int, call: Callable[[], bool]) -> bool:
        """``call()``; a failure is raised, or with ``keep_going`` kept (the fit leaves, False
        is returned)."""
        try:
            return call()
        except Exception as exc:
            if not self.keep_going:
                raise
            self.errors[k] = exc
            self.loops[k].close()
            log.error("fit %d of the %s failed and leaves it: %s: %s", k, self.word,
                      type(exc).__name__, exc)
            return False

    def _job(self, active: list[int], requests: list[Any]) -> list[AllReduceResult]:
        """One gradient job for the active fits (one fit: its own job)."""
        self.jobs += 1
        first = self.loops[active[0]].ctx
        if len(active) == 1:
            spec, weights = requests[0]
            return [run_with_recovery(
                first.runner, first.train,
                lambda: first.runner.gradients(first.train, spec, weights),
                lambda r: r.missing_partitions, self.loops[active[0]].job_name())]
        views = [self.loops[k].ctx.runner for k in active]
        runner = views[0].runner
        entries = [(view.fit, spec, weights) for view, (spec, weights) in zip(views, requests)]
        return run_with_recovery(
            views[0], first.train, lambda: runner.gradients_together(first.train, entries),
            lambda rs: sorted({p for r in rs for p in r.missing_partitions}),
            f"the pass's job {self.jobs} ({len(active)} fits)")
