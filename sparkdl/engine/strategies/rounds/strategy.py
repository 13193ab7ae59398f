"""The local rounds strategy: H iterations per Spark job, each partition's own optimizer, then
one exchange (driver side; :mod:`.jobs` says how, :mod:`.schedule` where rounds begin and end).

Each fit equals its own single-process definition (docs/guide/local-rounds.md): every
partition's worker starts a round from the global weights, makes H inner steps of its own copy
of the user's optimizer on exactly the samples synchronous SGD's plan gives its partition, and
the driver's outer optimizer takes the samples-weighted average delta as the gradient. ``H = 1``
with plain SGD inside and plain averaging is synchronous SGD up to float rounding. Fits with the
same H and warm-up train in one job per round.

Example::

    DistriOptimizer(net, rdd, loss, opt, batch_size=256, local_steps=16,
                    outer_optimizer="nesterov").optimize()      # RoundsStrategy
"""

from __future__ import annotations

from typing import Any, Sequence

from ....data.batch_plan import BatchPlan
from ....errors import InvalidArgumentError
from ....runners.interface import RoundRunner
from ....triggers import planned_iterations
from ...fit.checks.data_checks import DataSpec
from ...fit.opening import FitRun
from ...fit.optim.optimizer_sequence import needs_closure
from ...fit.resume.content_digest import content_digest
from ...fit.spec import OWNER, Fit
from ..base import FitsDriver
from .jobs import RoundMember, RoundSettings, RoundsJobs
from .schedule import longest_round
from ...fit.optim.outer_optimizer import describe_outer

__all__ = ["RoundsStrategy", "rounds_settings", "uses_rounds"]


def uses_rounds(fit: Fit) -> bool:
    """Whether ``fit`` trains in local rounds: ``local_steps`` above 1, or an outer optimizer
    given (``local_steps=1`` with none is synchronous SGD, bitwise)."""
    return fit.local_steps > 1 or fit.outer_optimizer is not None


def rounds_settings(fit: Fit) -> RoundSettings:
    """``fit``'s rounds settings."""
    return RoundSettings(fit.local_steps, fit.outer_optimizer, fit.sync_warmup)


class RoundsStrategy:
    """Local rounds (see the module docstring)."""

    name = "rounds"
    capability = RoundRunner
    needs = "a classic SparkContext (or LocalPartitions)"
    instead = ("Spark Connect runs synchronous SGD only in this version: use local_steps=1 "
               "and no outer_optimizer, or a classic session")

    def together(self, runner: Any) -> bool:
        """A round job trains every fit of the pass on any runner with rounds."""
        return True

    def announce(self, fits: list[int]) -> str | None:
        return (f"training {len(fits)} fits in local rounds, one job per round for all: {fits}"
                if len(fits) > 1 else None)

    def check(self, fit: Fit, runner: Any) -> None:
        """What rounds cannot run, refused before any job."""
        if fit.settings.runner_options.precision == "16-mixed":
            raise InvalidArgumentError(
                f"{OWNER}: local rounds train each partition's optimizer inside its task, where "
                "float16 training would need a loss scaler of its own: use precision='32' or "
                "'bf16-mixed' with local_steps > 1 (or an outer_optimizer).")
        if needs_closure(fit.optimizer):
            raise InvalidArgumentError(
                f"{OWNER}: {type(fit.optimizer).__name__}.step needs a closure (it evaluates "
                "the loss several times per step), and local rounds do not run such an "
                "optimizer as the partitions' inner optimizer: train it synchronously "
                "(local_steps=1 and no "
                "outer_optimizer, where each evaluation is one more gradient job), or use an "
                "optimizer whose step needs no closure (SGD, Adam, ...) inside the rounds.")

    def plan(self, fit: Fit, spec: DataSpec, position: int) -> "RoundsPlan":
        return RoundsPlan(spec.partition_sizes, fit.batch_size, fit.seed, fit.settings.shuffle,
                          rounds=rounds_settings(fit), key=_key_of(fit))

    def resume_key(self, plan: "RoundsPlan") -> dict[str, Any]:
        return dict(plan.key)

    def ships_model(self, fit: Fit) -> bool:
        return True             # the warm-up's jobs, validation and the AllReduce use it

    def describe(self, fit: Fit, plan: Any, how: str) -> str:
        warmup = (f", after {fit.sync_warmup} synchronous iterations" if fit.sync_warmup
                  else "")
        longest = longest_round(plan.iterations_per_epoch, fit.local_steps, fit.sync_warmup,
                                planned_iterations(fit.end_trigger, plan.iterations_per_epoch))
        length = (f"{fit.local_steps} iterations" if longest in (0, fit.local_steps) else
                  f"at most {longest} iterations (local_steps={fit.local_steps})")
        return (f"training on {plan.num_samples} samples in {plan.num_partitions} partitions in "
                f"local rounds of {length}{warmup}: global batch "
                f"{fit.batch_size}, {plan.iterations_per_epoch} iterations per epoch, outer "
                f"optimizer {describe_outer(fit.outer_optimizer)}, {how}")

    def driver(self, runs: Sequence[FitRun], runner: Any, keep_going: bool) -> FitsDriver:
        """The driver of the opened ``runs`` on ``runner`` (the pass's shared runner)."""
        members = [RoundMember(run.ctx, run.lifecycle, run.spec, run.ctx.plan.rounds)
                   for run in runs]
        return FitsDriver(members, RoundsJobs(members), "pass", keep_going)


class RoundsPlan(BatchPlan):
    """Synchronous SGD's batch plan (the samples of every iteration, wherever they train),
    with the fit's rounds settings and their part of its resume key."""

    def __init__(self, partition_sizes: Sequence[int], batch_size: int, seed: int,
                 shuffle: bool, rounds: RoundSettings, key: dict[str, Any]) -> None:
        super().__init__(partition_sizes, batch_size, seed, shuffle)
        self.rounds = rounds
        self.key = key


def _key_of(fit: Fit) -> dict[str, Any]:
    """The rounds' settings in ``fit``'s resume key (a callable outer optimizer by its
    content)."""
    outer = fit.outer_optimizer
    return {"strategy": "local rounds", "local_steps": fit.local_steps,
            "outer_optimizer": (describe_outer(outer) if outer is None or isinstance(outer, str)
                                else content_digest(outer, "outer_optimizer")[:16]),
            "sync_warmup": fit.sync_warmup}
