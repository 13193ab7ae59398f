"""Exceptions raised by sparkdl.

Every error a user can cause is a subclass of :class:`SparkdlError`, so callers can catch the
library's errors apart from Spark's or torch's own.
"""

from __future__ import annotations


class SparkdlError(Exception):
    """Base class of the errors sparkdl raises on purpose."""


class InvalidArgumentError(SparkdlError, ValueError):
    """An argument given to the engine (or a Param of an estimator) has a wrong type or value."""


class TrainingDataError(SparkdlError, ValueError):
    """The training or validation data cannot be used: bad shapes, types, labels or sizes."""


class ModelCriterionMismatchError(SparkdlError, ValueError):
    """The model's output does not fit the criterion (or the labels)."""
