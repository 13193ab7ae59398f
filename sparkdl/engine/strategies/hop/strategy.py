"""The hopping strategy: whole models trained where the data sits, one job per sub-epoch or
less for all of them (driver side; :mod:`.jobs` says how, :mod:`.order` in which order).

Each model equals single-process PyTorch trained on the same shards in its visiting order,
partition by partition; its visiting order depends on the set's hop seed and the fit's
rotation position only, which enter its resume key.

Example::

    FitSet(fits, strategy="hop", hop_seed=0).run()     # HopStrategy(0, positions)
"""

from __future__ import annotations

from typing import Any, Sequence

from ....runners.interface import HopRunner
from ...fit.checks.data_checks import DataSpec
from ...fit.opening import FitRun
from ...fit.spec import OWNER, Fit
from ..base import FitsDriver
from .jobs import HopJobs, HopMember, check_hop_settings
from .order import HopPlan

__all__ = ["HopStrategy"]


class HopStrategy:
    """Model hopping with ``seed`` (the epochs' partition orders) and each fit's rotation
    position (``positions``, by the fit's place among the strategy's fits)."""

    name = "hop"
    capability = HopRunner
    needs = "a classic SparkContext (or LocalPartitions)"
    instead = "under Spark Connect use 'together'"

    def __init__(self, seed: int = 0, positions: Sequence[int] | None = None) -> None:
        self.seed = seed
        self.positions = list(positions) if positions is not None else None

    def together(self, runner: Any) -> bool:
        """Hop jobs train every model of the set in one job on any runner that hops."""
        return True

    def announce(self, fits: list[int]) -> str | None:
        """The log line for the fits trained together (their positions and the seed)."""
        if not fits:
            return None
        positions = [self.positions[k] if self.positions is not None else k for k in fits]
        return (f"training {len(fits)} fits by model hopping over the same shards: {fits} "
                f"(rotation positions {positions}, hop seed {self.seed})")

    def check(self, fit: Fit, runner: Any) -> None:
        options = fit.settings.runner_options
        check_hop_settings(OWNER, options.precision, options.device)

    def plan(self, fit: Fit, spec: DataSpec, position: int) -> HopPlan:
        rotation = self.positions[position] if self.positions is not None else position
        return HopPlan(list(spec.partition_sizes), fit.batch_size, self.seed, rotation)

    def resume_key(self, plan: HopPlan) -> dict[str, Any]:
        return {"strategy": plan.strategy}

    def ships_model(self, fit: Fit) -> bool:
        return fit.validation is not None      # a hop ships it per job; here for validation

    def describe(self, fit: Fit, plan: HopPlan, how: str) -> str:
        return (f"training on {plan.num_samples} samples in {plan.num_partitions} partitions by "
                f"model hopping: batch {fit.batch_size}, {plan.iterations_per_epoch} sub-epochs "
                f"per epoch, rotation position {plan.position}")

    def driver(self, runs: Sequence[FitRun], runner: Any, keep_going: bool) -> FitsDriver:
        """The driver of the opened ``runs`` on ``runner`` (the pass's shared runner)."""
        members = [HopMember(run.ctx, run.lifecycle, run.spec) for run in runs]
        return FitsDriver([m.lifecycle for m in members], HopJobs(members, runner), "hop",
                          keep_going)
