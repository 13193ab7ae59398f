"""Exceptions raised by sparkdl.

Every error a user can cause is a subclass of :class:`SparkdlError`, so callers can catch the
library's errors apart from Spark's or torch's own.
"""

from __future__ import annotations


class SparkdlError(Exception):
    """Base class of the errors sparkdl raises on purpose.

    ``permanent``: raised in a task, a retry cannot fix it (the same input gives the same error),
    so the task reports it instead of failing, Spark does not retry it, and the driver raises the
    same class with the same message (:func:`permanent_error`)."""

    permanent = False


class ReplicaMismatchError(SparkdlError):
    """A task's model replica differs from the driver's weights (``verifyReplicas``)."""

    permanent = True


class InvalidArgumentError(SparkdlError, ValueError):
    """An argument given to the engine (or a Param of an estimator) has a wrong type or value."""

    permanent = True


class TrainingDataError(SparkdlError, ValueError):
    """The training or validation data cannot be used: bad shapes, types, labels or sizes."""

    permanent = True


class ModelCriterionMismatchError(SparkdlError, ValueError):
    """The model's output does not fit the criterion (or the labels)."""

    permanent = True


class TrainingStepError(ModelCriterionMismatchError):
    """A training step (``training_step``) returned something the engine cannot train on: not a
    scalar loss with grad, nor a pair ``(loss_sum, normaliser)`` (:mod:`sparkdl.training_step`)."""

    permanent = True


class CheckpointError(SparkdlError):
    """A checkpoint cannot be written, read, or does not belong to this model and data."""


class NonFiniteError(SparkdlError, FloatingPointError):
    """The loss or the gradient became NaN or infinite.

    Attributes:
        iteration: the 1-based iteration whose loss or gradient was not finite.
        state_dict: the last good weights (a copy of the model's state before that iteration).
        checkpoint: the checkpoint file written with those weights, or None.
    """

    def __init__(self, message: str, iteration: int, state_dict: dict,
                 checkpoint: str | None) -> None:
        super().__init__(message)
        self.iteration = iteration
        self.state_dict = state_dict
        self.checkpoint = checkpoint


class ExchangeError(SparkdlError):
    """A file in the exchange directory is not what the driver wrote (its content does not hash
    to the name it was shipped under)."""

    permanent = True


def _subclasses(cls: type) -> list[type]:
    return [cls] + [c for sub in cls.__subclasses__() for c in _subclasses(sub)]


def permanent_error(name: str, message: str) -> SparkdlError:
    """The driver's copy of a permanent error a task reported by class name: the same sparkdl
    class (never an arbitrary one: only subclasses of :class:`SparkdlError` are looked up), with
    the same message."""
    for cls in _subclasses(SparkdlError):
        if cls.__name__ == name and cls.permanent:
            try:
                return cls(message)
            except TypeError:
                break
    return SparkdlError(f"{name}: {message}")
