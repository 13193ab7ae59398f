"""The synchronous strategy: one data-parallel job per iteration, for one fit or for a pass of
several (driver side).

Each fit's global batches come from :class:`sparkdl.data.batch_plan.BatchPlan`; each iteration
is one gradient job (for all the fits of a pass: :mod:`.pass_jobs`), its sum the fit's union
gradient, stepped on the driver (:mod:`.step`). Each fit's weights equal single-process PyTorch
on the same union batches; a pass changes what training costs, never a fit's result.

Example::

    FitSet(fits).run()               # SyncStrategy(): one pass, or one fit alone
"""

from __future__ import annotations

from typing import Any, Sequence

from ....data.batch_plan import BatchPlan
from ....runners.fit_view import shares_passes
from ....runners.interface import GradientRunner
from ...fit.checks.data_checks import DataSpec
from ...fit.opening import FitRun
from ...fit.spec import Fit
from ..base import FitsDriver
from .pass_jobs import PassJobs
from .step import SyncStep

__all__ = ["SyncStrategy"]


class SyncStrategy:
    """Synchronous data-parallel SGD (see the module docstring); a pass of several fits needs
    a runner that runs passes (:class:`sparkdl.runners.interface.PassRunner`), one fit any
    :class:`~sparkdl.runners.interface.GradientRunner`."""

    name = "together"
    capability = GradientRunner
    needs = "a runner of gradient jobs"
    instead = ""

    def together(self, runner: Any) -> bool:
        """Whether ``runner`` runs several fits' iterations in one job (a pass)."""
        return shares_passes(runner)

    def announce(self, fits: list[int]) -> str | None:
        """The log line for the fits trained together (None for one)."""
        return (f"training {len(fits)} fits in one pass over the same shards: {fits}"
                if len(fits) > 1 else None)

    def check(self, fit: Fit, runner: Any) -> None:
        """Every setting runs synchronously: nothing to refuse."""

    def plan(self, fit: Fit, spec: DataSpec, position: int) -> BatchPlan:
        return BatchPlan(spec.partition_sizes, fit.batch_size, fit.seed, fit.settings.shuffle)

    def resume_key(self, plan: Any) -> dict[str, Any]:
        return {}

    def ships_model(self, fit: Fit) -> bool:
        return True

    def describe(self, fit: Fit, plan: Any, how: str) -> str:
        return (f"training on {plan.num_samples} samples in {plan.num_partitions} partitions: "
                f"global batch {fit.batch_size}, {plan.iterations_per_epoch} iterations per "
                f"epoch, {how}")

    def driver(self, runs: Sequence[FitRun], runner: Any, keep_going: bool) -> FitsDriver:
        """The driver of the opened ``runs`` on ``runner`` (the pass's shared runner)."""
        steps = [SyncStep(run.ctx, run.lifecycle) for run in runs]
        return FitsDriver(steps, PassJobs(steps), "pass", keep_going)
