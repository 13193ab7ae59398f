"""The jobs of a pass: several fits' synchronous SGD iterations, one gradient job for all of
them (driver side).

Each round, every active fit's step (:class:`~sparkdl.engine.strategies.sync.step.SyncStep`)
says what its iteration computes (``request``); one job computes all of them (the runner's
``gradients_together``, with the same recovery as a single fit's job) and each step completes
its own result (``complete``). A pass of one fit is one fit's own job per iteration.

Example::

    jobs = PassJobs([SyncStep(ctx_a, life_a), SyncStep(ctx_b, life_b)])
    FitsDriver(jobs.steps, jobs, "pass").run()
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ....transport.allreduce import AllReduceResult
from ...fit.recovery import run_with_recovery

__all__ = ["PassJobs"]


class PassJobs:
    """One gradient job per round for the active fits' steps (see the module docstring)."""

    def __init__(self, steps: Sequence[Any]) -> None:
        self.steps = list(steps)
        self.jobs = 0

    def starting(self, active: list[int]) -> None:
        """Nothing to prepare: each step ships its weights with its request."""

    def iteration(self, active: list[int]) -> dict[int, Callable[[], bool]]:
        """One job for the active fits; each fit's completion of it (True: the fit ended)."""
        requests = [self.steps[k].request() for k in active]
        results = self._job(active, requests)
        return {k: (lambda k=k, result=result: self.steps[k].complete(result))
                for k, result in zip(active, results)}

    def _job(self, active: list[int], requests: list[Any]) -> list[AllReduceResult]:
        """One gradient job for the active fits (one fit: its own job)."""
        self.jobs += 1
        first = self.steps[active[0]].ctx
        if len(active) == 1:
            spec, weights = requests[0]
            return [run_with_recovery(
                first.runner, first.train,
                lambda: first.runner.gradients(first.train, spec, weights),
                lambda r: r.missing_partitions, self.steps[active[0]].job_name())]
        views = [self.steps[k].ctx.runner for k in active]
        runner = views[0].runner
        entries = [(view.fit, spec, weights) for view, (spec, weights) in zip(views, requests)]
        return run_with_recovery(
            views[0], first.train, lambda: runner.gradients_together(first.train, entries),
            lambda rs: sorted({p for r in rs for p in r.missing_partitions}),
            f"the pass's job {self.jobs} ({len(active)} fits)")
