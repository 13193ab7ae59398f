"""Triggers: when training stops, when validation runs, when a checkpoint is written.

A trigger is asked after every iteration with the engine's :class:`TrainingState` and answers
whether it fires. The names follow BigDL's (``MaxEpoch``, ``MaxIteration``, ``EveryEpoch``,
``SeveralIteration``, ``MinLoss``, ``MaxScore``, ``And`` / ``Or``); triggers combine with ``&`` and
``|``. :class:`EarlyStopping` stops when a validation metric stops improving and can restore the
best weights. A trigger that reads a validation metric needs that metric in ``set_validation``:
the engine checks this before any cluster work.

Example::

    from sparkdl.triggers import EarlyStopping, MaxEpoch, MinLoss, SeveralIteration
    end = MaxEpoch(50) | MinLoss(0.01)                # whichever comes first
    every_100 = SeveralIteration(100)                  # e.g. validate every 100 iterations
    early = MaxEpoch(100) | EarlyStopping("Loss", patience=3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from .argument_checks import argument_error, check_choice, check_positive_int, check_type

__all__ = [
    "planned_iterations",
    "TrainingState",
    "Trigger",
    "MaxEpoch",
    "MaxIteration",
    "EveryEpoch",
    "SeveralIteration",
    "MinLoss",
    "MaxScore",
    "TriggerAnd",
    "TriggerOr",
    "EarlyStopping",
]


@dataclass(frozen=True)
class TrainingState:
    """Where training stands right after an iteration.

    ``iteration`` counts finished iterations (1 after the first); ``epoch`` counts finished
    epochs; ``epoch_finished`` is true when the iteration just done closed an epoch; ``loss`` is
    that iteration's training loss (None before the first); ``metrics`` the latest validation
    results by metric name (empty before the first validation); ``validated`` is true when
    validation ran right after this iteration (``metrics`` are new).
    """

    iteration: int
    epoch: int
    epoch_finished: bool
    loss: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    validated: bool = False


class Trigger:
    """Base class: subclasses implement :meth:`__call__`; ``a & b`` and ``a | b`` combine."""

    def __call__(self, state: TrainingState) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __and__(self, other: "Trigger") -> "TriggerAnd":
        return TriggerAnd(self, other)

    def __or__(self, other: "Trigger") -> "TriggerOr":
        return TriggerOr(self, other)

    def children(self) -> list["Trigger"]:
        """The triggers this one combines (none for a plain trigger)."""
        return []

    def walk(self) -> Iterator["Trigger"]:
        """This trigger and every trigger inside it, depth first."""
        yield self
        for child in self.children():
            yield from child.walk()

    def metric_names(self) -> set[str]:
        """Validation metrics this trigger (with its children) reads."""
        return set().union(*(c.metric_names() for c in self.children()))

    def reset(self) -> None:
        """Forget what earlier runs taught a stateful trigger (called when a run starts)."""

    def state_dict(self) -> dict[str, Any]:
        """What a stateful trigger must keep across a checkpoint (plain values)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class _CountReached(Trigger):
    """Fires once the training state's ``count`` attribute reaches ``limit`` (the end triggers:
    ``MaxEpoch(3).limit == 3``)."""

    count = ""
    argument = ""

    def __init__(self, limit: int) -> None:
        self.limit = check_positive_int(self.argument, type(self).__name__, limit)

    def __call__(self, state: TrainingState) -> bool:
        return getattr(state, self.count) >= self.limit


class MaxEpoch(_CountReached):
    """Fires once ``max_epoch`` epochs are finished (an end trigger).

    Example: ``DistriOptimizer(..., end_trigger=MaxEpoch(3))``.
    """

    count, argument = "epoch", "max_epoch"


class MaxIteration(_CountReached):
    """Fires once ``max_iteration`` iterations are done (an end trigger).

    Example: ``DistriOptimizer(..., end_trigger=MaxIteration(1000))``.
    """

    count, argument = "iteration", "max_iteration"


class EveryEpoch(Trigger):
    """Fires after the last iteration of every epoch.

    Example: ``opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy()])``.
    """

    def __call__(self, state: TrainingState) -> bool:
        return state.epoch_finished


class SeveralIteration(Trigger):
    """Fires every ``interval`` iterations.

    Example: ``opt.set_validation(val_rdd, SeveralIteration(50), [Loss()])``.
    """

    def __init__(self, interval: int) -> None:
        self.interval = check_positive_int("interval", "SeveralIteration", interval)

    def __call__(self, state: TrainingState) -> bool:
        return state.iteration % self.interval == 0


def _finite_number(name: str, owner: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise argument_error(name, owner, "a finite number", value)
    return float(value)


def _metric_name(owner: str, metric: Any) -> str:
    if not isinstance(metric, str) or not metric:
        raise argument_error("metric", owner, "the name of a validation metric such as "
                             "'Loss' or 'Top1Accuracy'", metric)
    return metric


class MinLoss(Trigger):
    """Fires once the training loss of an iteration is below ``value`` (an end trigger).

    Example: ``end_trigger=MaxEpoch(20) | MinLoss(0.05)``.
    """

    def __init__(self, value: float) -> None:
        self.value = _finite_number("value", "MinLoss", value)

    def __call__(self, state: TrainingState) -> bool:
        return state.loss is not None and state.loss < self.value


class MaxScore(Trigger):
    """Fires once the latest value of validation metric ``metric`` is above ``value``.

    Example: ``end_trigger=MaxEpoch(20) | MaxScore("Top1Accuracy", 0.95)``.
    """

    def __init__(self, metric: str, value: float) -> None:
        self.metric = _metric_name("MaxScore", metric)
        self.value = _finite_number("value", "MaxScore", value)

    def __call__(self, state: TrainingState) -> bool:
        score = state.metrics.get(self.metric)
        return score is not None and score > self.value

    def metric_names(self) -> set[str]:
        return {self.metric}


class _Combined(Trigger):
    """Asks every trigger it holds each time (stateful ones see every state), then combines."""

    def __init__(self, *triggers: Trigger) -> None:
        owner = type(self).__name__
        if len(triggers) < 2:
            raise argument_error("triggers", owner, "at least two triggers", list(triggers))
        for t in triggers:
            check_type("triggers", owner, t, Trigger, "sparkdl.triggers.Trigger objects")
        self.triggers = list(triggers)

    def children(self) -> list[Trigger]:
        return self.triggers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(t) for t in self.triggers)})"


class TriggerAnd(_Combined):
    """Fires when all of its triggers fire (``a & b``).

    Example: ``MinLoss(0.1) & MaxScore("Top1Accuracy", 0.9)``.
    """

    def __call__(self, state: TrainingState) -> bool:
        return all([t(state) for t in self.triggers])


class TriggerOr(_Combined):
    """Fires when any of its triggers fires (``a | b``).

    Example: ``MaxEpoch(10) | MinLoss(0.01)``.
    """

    def __call__(self, state: TrainingState) -> bool:
        return any([t(state) for t in self.triggers])


class EarlyStopping(Trigger):
    """Fires when validation metric ``metric`` has not improved for ``patience`` validations in
    a row (an end trigger; combine it with a bound, e.g. ``MaxEpoch(100) | EarlyStopping(...)``).

    ``mode="min"`` (a loss) or ``"max"`` (an accuracy); an improvement is any strictly better
    value. With ``restore_best=True`` the model ends with the weights of the best validation
    when this trigger ended training. ``best``, ``best_iteration`` tell the outcome.

    Example::

        opt = DistriOptimizer(..., end_trigger=MaxEpoch(100) | EarlyStopping("Loss", patience=3))
        opt.set_validation(val_rdd, EveryEpoch(), [Loss()])
    """

    def __init__(self, metric: str, patience: int, mode: str = "min",
                 restore_best: bool = True) -> None:
        self.metric = _metric_name("EarlyStopping", metric)
        self.patience = check_positive_int("patience", "EarlyStopping", patience)
        self.mode = check_choice("mode", "EarlyStopping", mode, ("min", "max"))
        self.restore_best = check_type("restore_best", "EarlyStopping", restore_best, bool,
                                       "a bool")
        self.reset()

    def reset(self) -> None:
        self.best: float | None = None
        self.best_iteration = 0
        self.waited = 0
        self.stopped = False
        self.improved = False

    def __call__(self, state: TrainingState) -> bool:
        self.improved = False
        if state.validated and self.metric in state.metrics:
            value = state.metrics[self.metric]
            better = self.best is None or (value < self.best if self.mode == "min"
                                           else value > self.best)
            if better:
                self.best, self.best_iteration, self.waited = value, state.iteration, 0
                self.improved = True
            else:
                self.waited += 1
        self.stopped = self.waited >= self.patience
        return self.stopped

    def metric_names(self) -> set[str]:
        return {self.metric}

    def __repr__(self) -> str:
        return (f"EarlyStopping({self.metric!r}, patience={self.patience}, mode={self.mode!r}, "
                f"restore_best={self.restore_best})")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_iteration": self.best_iteration, "waited": self.waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.best_iteration = int(state["best_iteration"])
        self.waited = int(state["waited"])
        self.stopped = self.waited >= self.patience


def planned_iterations(trigger: Trigger, iterations_per_epoch: int) -> int | None:
    """The last iteration the end trigger allows, when it says so in advance, else None: a
    ``MaxEpoch`` or ``MaxIteration``; ``a | b`` the smallest bound among its parts that have
    one (it fires at the latest there); ``a & b`` the largest, when every part has one. Used
    for the ETA and to refuse resuming a checkpoint past the run's end.

    Example: ``planned_iterations(MaxEpoch(3), 100)`` is 300, and so is
    ``planned_iterations(MaxEpoch(3) | EarlyStopping("Loss", patience=5), 100)``."""
    if isinstance(trigger, MaxEpoch):
        return trigger.limit * iterations_per_epoch
    if isinstance(trigger, MaxIteration):
        return trigger.limit
    if isinstance(trigger, (TriggerOr, TriggerAnd)):
        bounds = [planned_iterations(t, iterations_per_epoch) for t in trigger.triggers]
        if isinstance(trigger, TriggerOr):
            known = [b for b in bounds if b is not None]
            return min(known) if known else None
        return None if None in bounds else max(bounds)  # type: ignore[type-var]
    return None
