"""The Params of the DataFrame estimators, their defaults and their validation.

Every tunable Param holds a plain JSON value (grids and saved metadata are JSON). Values are
validated in one place, :func:`validate_params`, at ``fit`` time before any cluster work, with one
message template: "The 'x' Param of Y must be ... Got ... instead.".
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasBatchSize, HasFeaturesCol, HasLabelCol, HasLearningRate,
                                     HasMomentum, HasNumTrainWorkers, HasPredictionCol,
                                     HasProbabilityCol, HasRawPredictionCol, HasSeed,
                                     HasValidationIndicatorCol)

from .errors import InvalidArgumentError

__all__ = ["NNParams", "NNClassifierParams", "OPTIMIZERS", "validate_params"]

OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")


class NNParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasBatchSize, HasLearningRate,
               HasMomentum, HasSeed, HasNumTrainWorkers, HasValidationIndicatorCol):
    """Params shared by the estimators and their models."""

    featuresCols: "Param[list[str]]" = Param(
        Params._dummy(), "featuresCols",
        "numeric feature columns, used instead of featuresCol when non-empty",
        typeConverter=TypeConverters.toListString)
    featureShape: "Param[list[int]]" = Param(
        Params._dummy(), "featureShape",
        "shape of one sample's features (e.g. [1, 28, 28]); flat features are reshaped to it",
        typeConverter=TypeConverters.toListInt)
    maxEpoch: "Param[int]" = Param(Params._dummy(), "maxEpoch", "number of epochs to train",
                                   typeConverter=TypeConverters.toInt)
    optimizer: "Param[str]" = Param(Params._dummy(), "optimizer",
                                    f"torch optimizer: one of {', '.join(OPTIMIZERS)}",
                                    typeConverter=TypeConverters.toString)
    weightDecay: "Param[float]" = Param(Params._dummy(), "weightDecay",
                                        "L2 penalty (weight decay) of the optimizer",
                                        typeConverter=TypeConverters.toFloat)
    microBatchSize: "Param[int]" = Param(
        Params._dummy(), "microBatchSize",
        "accumulate each task's gradient over micro-batches of this size (0: off)",
        typeConverter=TypeConverters.toInt)
    inferenceBatchSize: "Param[int]" = Param(Params._dummy(), "inferenceBatchSize",
                                             "rows per model call in transform",
                                             typeConverter=TypeConverters.toInt)
    progressBar: "Param[bool]" = Param(
        Params._dummy(), "progressBar",
        "show a progress bar while fitting when interactive (a notebook or a terminal)",
        typeConverter=TypeConverters.toBoolean)
    tensorboardDir: "Param[str]" = Param(
        Params._dummy(), "tensorboardDir",
        "also write training and validation scalars for TensorBoard here (\"\": off)",
        typeConverter=TypeConverters.toString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction",
                         featuresCols=[], featureShape=[], batchSize=128, maxEpoch=10,
                         learningRate=1e-3, optimizer="adam", momentum=0.0, weightDecay=0.0,
                         seed=0, numTrainWorkers=0, validationIndicatorCol="",
                         microBatchSize=0, inferenceBatchSize=1024, progressBar=True,
                         tensorboardDir="")


    def getFeaturesCols(self) -> list[str]:
        return self.getOrDefault(self.featuresCols)

    def getFeatureShape(self) -> list[int]:
        return self.getOrDefault(self.featureShape)

    def getMaxEpoch(self) -> int:
        return self.getOrDefault(self.maxEpoch)

    def getOptimizer(self) -> str:
        return self.getOrDefault(self.optimizer)

    def getWeightDecay(self) -> float:
        return self.getOrDefault(self.weightDecay)

    def getMicroBatchSize(self) -> int:
        return self.getOrDefault(self.microBatchSize)

    def getInferenceBatchSize(self) -> int:
        return self.getOrDefault(self.inferenceBatchSize)

    def getProgressBar(self) -> bool:
        return self.getOrDefault(self.progressBar)

    def getTensorboardDir(self) -> str:
        return self.getOrDefault(self.tensorboardDir)

    def setParams(self, **params: Any) -> "NNParams":
        """Set any Params by name, e.g. ``setParams(batchSize=64, maxEpoch=3)``."""
        return self._set(**params)


def _add_setters(cls: type) -> None:
    """Spark ML style ``setX(value)`` for every Param of ``cls``."""
    for name in dir(cls):
        if isinstance(getattr(cls, name, None), Param):
            setter = "set" + name[0].upper() + name[1:]
            if not hasattr(cls, setter):
                def make(param: str) -> Any:
                    def set_value(self: Params, value: Any) -> Params:
                        return self._set(**{param: value})
                    set_value.__doc__ = f"Sets the value of :py:attr:`{param}`."
                    return set_value
                setattr(cls, setter, make(name))


class NNClassifierParams(NNParams, HasProbabilityCol, HasRawPredictionCol):
    """Params of the classifier and its model."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(probabilityCol="probability", rawPredictionCol="rawPrediction")


_add_setters(NNParams)
_add_setters(NNClassifierParams)


def _error(param: str, owner: str, expected: str, got: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"The '{param}' Param of {owner} must be {expected}. "
                                f"Got {got!r} instead.")


def validate_params(stage: Params) -> None:
    """Check every Param value of ``stage``; raise the first problem found."""
    owner = type(stage).__name__
    get = stage.getOrDefault
    for name in ("batchSize", "maxEpoch", "inferenceBatchSize"):
        if stage.hasParam(name) and get(name) <= 0:
            raise _error(name, owner, "a positive int", get(name))
    for name in ("numTrainWorkers", "microBatchSize"):
        if stage.hasParam(name) and get(name) < 0:
            raise _error(name, owner, "an int >= 0 (0: automatic/off)", get(name))
    if get("learningRate") <= 0:
        raise _error("learningRate", owner, "a positive float", get("learningRate"))
    if get("momentum") < 0:
        raise _error("momentum", owner, "a float >= 0", get("momentum"))
    if get("weightDecay") < 0:
        raise _error("weightDecay", owner, "a float >= 0", get("weightDecay"))
    if get("optimizer") not in OPTIMIZERS:
        raise _error("optimizer", owner, f"one of {list(OPTIMIZERS)}", get("optimizer"))
    if any(d <= 0 for d in get("featureShape")):
        raise _error("featureShape", owner, "a list of positive ints", get("featureShape"))
    if not get("featuresCols") and not get("featuresCol"):
        raise _error("featuresCol", owner, "a column name (or set featuresCols)",
                     get("featuresCol"))
    if not get("labelCol"):
        raise _error("labelCol", owner, "a column name", get("labelCol"))
