"""Exceptions raised by sparkdl.

Every error a user can cause is a subclass of :class:`SparkdlError`, so callers can catch the
library's errors apart from Spark's or torch's own.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

log = logging.getLogger("sparkdl")


class SparkdlError(Exception):
    """Base class of the errors sparkdl raises on purpose.

    ``permanent``: raised in a task, a retry cannot fix it (the same input gives the same error),
    so the task reports it instead of failing (:func:`permanent_report`), Spark does not retry
    it, and the driver raises the same class with the same message (:func:`permanent_error`).
    A subclass of your own with ``permanent = True``, raised in your code that a task runs (an
    RDD's map function, a training step, a metric), travels the same way."""

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


class EmptyDataError(TrainingDataError):
    """The training or validation data has no record (``what``: which of the two); the
    estimators say which DataFrame rows it lacks (e.g. a ``validationIndicatorCol`` true for
    every row)."""

    permanent = True

    def __init__(self, message: str, what: str = "training") -> None:
        super().__init__(message)
        self.what = what


class UnidentifiableError(InvalidArgumentError):
    """An object that decides a checkpointed fit's result has no content sparkdl can hash
    deterministically (:mod:`sparkdl.engine.fit.resume.content_digest`): name the fit with
    ``set_fit_identity`` (estimators: ``fitIdentity``)."""


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


class ExecutorImportError(SparkdlError, ImportError):
    """The executors' Python cannot import sparkdl (it lacks it, or finds another project's
    module of that name first): the driver's fit ends with how to ship it to the executors
    (:mod:`sparkdl.runners.executor_imports`)."""


def _subclasses(cls: type) -> list[type]:
    return [cls] + [c for sub in cls.__subclasses__() for c in _subclasses(sub)]


def permanent_report(exc: BaseException) -> tuple[str, str] | None:
    """What a task reports in place of raising ``exc``: ``(class name, message)`` of a
    permanent sparkdl error (:attr:`SparkdlError.permanent`), which the driver raises again with
    :func:`permanent_error`; None for any other error, which the task raises (Spark retries
    it). Every task kind reports this way: gradient, validation, shard build and fill tasks."""
    if isinstance(exc, SparkdlError) and exc.permanent:
        return type(exc).__name__, str(exc)
    return None


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


def raise_reported(results: Sequence[Any], what: str) -> None:
    """Raise the permanent error that the first of ``results`` carries in its ``fatal``
    (``(class name, message)``; the results of tasks: task reports, partition metrics, shard
    summaries, each with its ``partition``) as :func:`permanent_error` makes it; nothing when
    none carries one. ``what`` names the job in the log line."""
    first = next((r for r in results if r.fatal is not None), None)
    if first is None:
        return
    name, message = first.fatal
    log.error("%s: the task of partition %d raised %s: %s", what, first.partition, name,
              message)
    raise permanent_error(name, message)


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or what can be said without it: a Java exception's text is fetched from
    the driver's JVM, which a failure may have ended.

    Example::

        log.warning("cleanup failed: %s", exception_text(exc)[:300])
    """
    try:
        return str(exc)
    except Exception:            # noqa: BLE001 - py4j could not reach the JVM
        return f"{type(exc).__name__} (its text was in the driver's JVM, which is gone)"
