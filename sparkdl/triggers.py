"""Triggers: when training stops, when validation runs, when a checkpoint is written.

A trigger is asked after every iteration with the engine's :class:`TrainingState` and answers
whether it fires. The names follow BigDL's (``MaxEpoch``, ``MaxIteration``, ``EveryEpoch``,
``SeveralIteration``).

Example::

    from sparkdl.triggers import MaxEpoch, SeveralIteration
    end = MaxEpoch(5)                 # stop after 5 full passes over the data
    every_100 = SeveralIteration(100) # e.g. validate every 100 iterations
"""

from __future__ import annotations

from dataclasses import dataclass

from .argument_checks import check_positive_int

__all__ = [
    "TrainingState",
    "Trigger",
    "MaxEpoch",
    "MaxIteration",
    "EveryEpoch",
    "SeveralIteration",
]


@dataclass(frozen=True)
class TrainingState:
    """Where training stands right after an iteration.

    ``iteration`` counts finished iterations (1 after the first); ``epoch`` counts finished
    epochs; ``epoch_finished`` is true when the iteration just done closed an epoch.
    """

    iteration: int
    epoch: int
    epoch_finished: bool


class Trigger:
    """Base class: subclasses implement :meth:`__call__`."""

    def __call__(self, state: TrainingState) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{v!r}" for v in vars(self).values())
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
