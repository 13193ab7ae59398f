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

from .errors import InvalidArgumentError

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


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(
            f"The '{name}' argument must be a positive int. Got {value!r} instead."
        )
    return value


class Trigger:
    """Base class: subclasses implement :meth:`__call__`."""

    def __call__(self, state: TrainingState) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{v!r}" for v in vars(self).values())
        return f"{type(self).__name__}({fields})"


class MaxEpoch(Trigger):
    """Fires once ``max_epoch`` epochs are finished (an end trigger).

    Example: ``DistriOptimizer(..., end_trigger=MaxEpoch(3))``.
    """

    def __init__(self, max_epoch: int) -> None:
        self.max_epoch = _positive_int("max_epoch", max_epoch)

    def __call__(self, state: TrainingState) -> bool:
        return state.epoch >= self.max_epoch


class MaxIteration(Trigger):
    """Fires once ``max_iteration`` iterations are done (an end trigger).

    Example: ``DistriOptimizer(..., end_trigger=MaxIteration(1000))``.
    """

    def __init__(self, max_iteration: int) -> None:
        self.max_iteration = _positive_int("max_iteration", max_iteration)

    def __call__(self, state: TrainingState) -> bool:
        return state.iteration >= self.max_iteration


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
        self.interval = _positive_int("interval", interval)

    def __call__(self, state: TrainingState) -> bool:
        return state.iteration % self.interval == 0
