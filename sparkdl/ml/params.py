"""The Params of the DataFrame estimators, their defaults and their validation.

Every tunable Param holds a plain JSON value (grids and saved metadata are JSON). Values are
validated in one place, :func:`validate_params`, at ``fit`` time before any cluster work, with one
message template: "The 'x' Param of Y must be ... Got ... instead.".
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, TypeVar

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasLabelCol, HasPredictionCol,
                                     HasProbabilityCol, HasRawPredictionCol, HasSeed,
                                     HasValidationIndicatorCol)

from ..argument_checks import argument_error
from ..errors import InvalidArgumentError
from ..engine.fit.optim.loss_scaling import PRECISIONS
from ..engine.fit.optim.outer_optimizer import OUTER_OPTIMIZERS
from ..engine.fit_set import STRATEGIES
from ..executor.devices import DEVICES
from ..spark_compat import HasBatchSize, HasLearningRate, HasMomentum, HasNumTrainWorkers
from .engine_settings import METRIC_NAMES

__all__ = ["NNParams", "NNClassifierParams", "OPTIMIZERS", "known_keywords", "validate_params"]

OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")


_OWN_PARAMS: dict[str, tuple[Any, str]] = {
    "featuresCols": (TypeConverters.toListString,
                     "numeric feature columns, used instead of featuresCol when non-empty"),
    "inputCols": (TypeConverters.toListString,
                  "one column per model input, in order: model(*inputs); each a Vector, a "
                  "numeric array, a numeric scalar or an image column (integer columns reach "
                  "the model as int64); instead of featuresCol/featuresCols"),
    "featureShape": (TypeConverters.toListInt,
                     "shape of one sample's features (e.g. [1, 28, 28]); flat features are "
                     "reshaped to it"),
    "maxEpoch": (TypeConverters.toInt, "number of epochs to train"),
    "optimizer": (TypeConverters.toString, f"torch optimizer: one of {', '.join(OPTIMIZERS)}"),
    "weightDecay": (TypeConverters.toFloat, "L2 penalty (weight decay) of the optimizer"),
    "microBatchSize": (TypeConverters.toInt,
                       "accumulate each task's gradient over micro-batches of this size (0: off)"),
    "inferenceBatchSize": (TypeConverters.toInt, "rows per model call in transform"),
    "subReplicas": (TypeConverters.toInt,
                    "how a fit task with several cores (spark.task.cpus) uses them: that many "
                    "model copies in threads, summed in the task, when the model allows it "
                    "(0: automatic), 1: one copy with intra-op threads, k: k copies"),
    "progressBar": (TypeConverters.toBoolean,
                    "show a progress bar while fitting when interactive (a notebook or a "
                    "terminal)"),
    "device": (TypeConverters.toString,
               "where tasks compute, in fit and transform: 'auto' (the task's GPU when Spark "
               "assigned one and CUDA is available, else the CPU), 'cpu' or 'cuda'"),
    "precision": (TypeConverters.toString,
                  "'32', 'bf16-mixed' or '16-mixed' (autocast in the tasks; float16 with a "
                  "global loss scale)"),
    "tensorboardDir": (TypeConverters.toString,
                       "also write training and validation scalars for TensorBoard here "
                       "(\"\": off)"),
    "mlflowLogging": (TypeConverters.toBoolean,
                      "log the fit to MLflow (needs sparkdl-torch[mlflow]): Params, per-iteration loss "
                      "and throughput, validation metrics, summary; into the active run, a child "
                      "run per fit under CrossValidator/TrainValidationSplit, else a new run"),
    "checkpointDir": (TypeConverters.toString,
                      "write the whole training state here after every epoch and resume from "
                      "the newest checkpoint found there (any Hadoop path; under Spark Connect a path "
                      "or URI pyarrow.fs reaches; \"\": off)"),
    "exchangeDir": (TypeConverters.toString,
                    "Spark Connect only: a directory this client writes and every executor "
                    "reads under the same name (a shared mount, s3://, gs://, abfs://, hdfs://), "
                    "through which the weights of models above 8 MiB travel each iteration "
                    "(\"\": weights ride inside the jobs' functions, which Connect limits)"),
    "gradientClipNorm": (TypeConverters.toFloat,
                         "clip the union batch's gradient to this total L2 norm before every "
                         "step (0: off)"),
    "earlyStoppingPatience": (TypeConverters.toInt,
                              "stop when the validation loss has not improved for this many "
                              "epochs in a row (needs validationIndicatorCol; 0: off)"),
    "restoreBest": (TypeConverters.toBoolean,
                    "with early stopping, end with the weights of the best validation epoch"),
    "sequenceCols": (TypeConverters.toListString,
                     "input columns (array<numeric>) whose rows vary in length: kept as values "
                     "plus offsets, padded per batch to its longest row with paddingValue; the "
                     "model receives the padded tensor [batch, longest] followed by the lengths "
                     "[batch] (int64) for each"),
    "paddingValue": (TypeConverters.toFloat, "what pads the sequenceCols in a batch"),
    "weightCol": (TypeConverters.toString,
                  "per-row sample weights (numeric, >= 0): the loss is the weighted mean over "
                  "each union batch; validation metrics stay unweighted (\"\": off)"),
    "tuningStrategy": (TypeConverters.toString,
                       "how fitMultiple (CrossValidator, TrainValidationSplit) trains its param "
                       "maps: 'together' (each model exactly the data-parallel fit of its map, "
                       "one job per iteration for all) or 'hop' (model hopping: each model "
                       "trained whole with sequential SGD, partition after partition, one job "
                       "per sub-epoch for all; faster for model selection). fit ignores it"),
    "localSteps": (TypeConverters.toInt,
                   "H, the iterations of a local round: every partition trains its own copy "
                   "of the optimizer for H iterations on its share of the global batches, then "
                   "one exchange (1: synchronous SGD, one job per iteration)"),
    "syncWarmup": (TypeConverters.toInt,
                   "synchronous iterations before the local rounds begin (post-local SGD)"),
    "validationMetrics": (TypeConverters.toListString,
                          "metrics computed on the validation rows every epoch: any of "
                          "'loss', 'accuracy', 'mae' ([]: loss, plus accuracy for classifiers)"),
}
"""sparkdl's own Params (name: converter, doc); the rest come from pyspark's shared mixins."""


class NNParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasBatchSize, HasLearningRate,
               HasMomentum, HasSeed, HasNumTrainWorkers, HasValidationIndicatorCol):
    """Params shared by the estimators and their models."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction",
                         featuresCols=[], inputCols=[], featureShape=[], batchSize=128, maxEpoch=10,
                         learningRate=1e-3, optimizer="adam", momentum=0.0, weightDecay=0.0,
                         seed=0, numTrainWorkers=0, validationIndicatorCol="",
                         microBatchSize=0, subReplicas=0, inferenceBatchSize=1024, progressBar=True,
                         tensorboardDir="", mlflowLogging=False, device="auto", precision="32",
                         checkpointDir="", gradientClipNorm=0.0, earlyStoppingPatience=0,
                         restoreBest=True, validationMetrics=[], sequenceCols=[],
                         paddingValue=0.0, weightCol="", exchangeDir="",
                         tuningStrategy="together", localSteps=1, syncWarmup=0)

    def setParams(self, **params: Any) -> "NNParams":
        """Set any Params by name, e.g. ``setParams(batchSize=64, maxEpoch=3)`` (the
        estimators spell theirs out; this serves the fitted models)."""
        refuse_unknown(self, params, ())
        return self._set(**params)


Method = TypeVar("Method", bound=Callable[..., Any])


def param_names(cls: type) -> list[str]:
    """The names of ``cls``'s Params, sorted."""
    return sorted(n for n in dir(cls) if isinstance(getattr(cls, n, None), Param))


def refuse_unknown(stage: Params, keywords: Any, others: Any) -> None:
    """An :class:`InvalidArgumentError` for the first of ``keywords`` that is neither a Param
    of ``stage`` nor one of ``others`` (the other arguments the method takes), naming the
    Params and the closest spelling."""
    params = param_names(type(stage))
    known = set(params) | set(others)
    unknown = sorted(k for k in keywords if k not in known)
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    rest = sorted(set(others) - set(params))
    raise InvalidArgumentError(
        f"{type(stage).__name__} has no Param {unknown[0]!r}; its Params are {params}"
        + (f", and it also takes {', '.join(rest)}" if rest else "")
        + (f". Did you mean {close[0]!r}?" if close else "."))


def known_keywords(method: Method) -> Method:
    """Wraps a stage's ``@keyword_only`` ``__init__`` or ``setParams`` (put it above) so that
    a keyword the signature lacks is an :class:`InvalidArgumentError` naming the stage's
    Params, not Python's bare ``TypeError``.

    Example::

        @known_keywords
        @keyword_only
        def setParams(self, *, batchSize: int = 128) -> "Stage": ...
    """
    names = [n for n in inspect.signature(method).parameters if n != "self"]

    @functools.wraps(method)
    def checked(self: Params, *args: Any, **kwargs: Any) -> Any:
        refuse_unknown(self, kwargs, names)
        return method(self, *args, **kwargs)

    return checked  # type: ignore[return-value]


def _getter(param: str) -> Any:
    def get_value(self: Params) -> Any:
        return self.getOrDefault(param)
    get_value.__doc__ = f"Gets the value of :py:attr:`{param}` or its default value."
    return get_value


def _setter(param: str) -> Any:
    def set_value(self: Params, value: Any) -> Params:
        return self._set(**{param: value})
    set_value.__doc__ = f"Sets the value of :py:attr:`{param}`."
    return set_value


def _add_accessors(cls: type) -> None:
    """Spark ML style ``getX()`` and ``setX(value)`` for every Param of ``cls`` that lacks
    them (pyspark's shared mixins bring their own getters)."""
    for name in dir(cls):
        if isinstance(getattr(cls, name, None), Param):
            suffix = name[0].upper() + name[1:]
            for prefix, make in (("get", _getter), ("set", _setter)):
                if not hasattr(cls, prefix + suffix):
                    setattr(cls, prefix + suffix, make(name))


class NNClassifierParams(NNParams, HasProbabilityCol, HasRawPredictionCol):
    """Params of the classifier and its model."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(probabilityCol="probability", rawPredictionCol="rawPrediction")


for _name, (_converter, _doc) in _OWN_PARAMS.items():
    setattr(NNParams, _name, Param(Params._dummy(), _name, _doc, typeConverter=_converter))
_add_accessors(NNParams)
_add_accessors(NNClassifierParams)


def _error(param: str, owner: str, expected: str, got: Any) -> Exception:
    return argument_error(param, owner, expected, got, kind="Param")


def validate_params(stage: Params) -> None:
    """Check every Param value of ``stage``; raise the first problem found."""
    owner = type(stage).__name__
    get = stage.getOrDefault
    for name in ("batchSize", "maxEpoch", "inferenceBatchSize"):
        if stage.hasParam(name) and get(name) <= 0:
            raise _error(name, owner, "a positive int", get(name))
    if stage.hasParam("localSteps") and get("localSteps") <= 0:
        raise _error("localSteps", owner, "a positive int (1: synchronous SGD)",
                     get("localSteps"))
    if stage.hasParam("syncWarmup") and get("syncWarmup") < 0:
        raise _error("syncWarmup", owner, "an int >= 0", get("syncWarmup"))
    if stage.hasParam("outerOptimizer"):
        outer = get("outerOptimizer")
        if not (outer is None or callable(outer) or outer in OUTER_OPTIMIZERS):
            raise _error("outerOptimizer", owner, "None, 'average', 'nesterov' or a callable "
                         "params -> torch optimizer", outer)
    for name in ("numTrainWorkers", "microBatchSize", "subReplicas"):
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
    if not get("featuresCols") and not get("featuresCol") and not get("inputCols"):
        raise _error("featuresCol", owner, "a column name (or set featuresCols or inputCols)",
                     get("featuresCol"))
    if get("inputCols"):
        clash = [p for p in ("featuresCol", "featuresCols") if stage.isSet(p)]
        if clash:
            raise InvalidArgumentError(
                f"{owner} has both inputCols and {clash[0]} set; inputCols (one column per "
                f"model input) replaces {clash[0]}: clear {clash[0]} with "
                f"clear(stage.{clash[0]}) or leave inputCols empty.")
        if len(set(get("inputCols"))) != len(get("inputCols")) or not all(get("inputCols")):
            raise _error("inputCols", owner, "a list of distinct column names",
                         get("inputCols"))
        if get("featureShape"):
            raise _error("featureShape", owner, "empty with inputCols (each input keeps its "
                         "column's shape; reshape inside the model)", get("featureShape"))
    if not get("labelCol"):
        raise _error("labelCol", owner, "a column name", get("labelCol"))
    if get("gradientClipNorm") < 0:
        raise _error("gradientClipNorm", owner, "a float >= 0 (0: off)", get("gradientClipNorm"))
    if get("earlyStoppingPatience") < 0:
        raise _error("earlyStoppingPatience", owner, "an int >= 0 (0: off)",
                     get("earlyStoppingPatience"))
    if get("sequenceCols") and get("featuresCols") and not get("inputCols"):
        raise _error("sequenceCols", owner, "empty with featuresCols (columns side by side have "
                     "one length; name the columns in inputCols instead)", get("sequenceCols"))
    if get("sequenceCols") and get("featureShape"):
        raise _error("featureShape", owner, "empty with sequenceCols (a sequence has no fixed "
                     "shape)", get("featureShape"))
    if len(set(get("sequenceCols"))) != len(get("sequenceCols")) or \
            not all(get("sequenceCols")):
        raise _error("sequenceCols", owner, "a list of distinct column names",
                     get("sequenceCols"))
    metrics = get("validationMetrics")
    if any(m not in METRIC_NAMES for m in metrics) or len(set(metrics)) != len(metrics):
        raise _error("validationMetrics", owner,
                     f"a list of distinct names among {list(METRIC_NAMES)}", metrics)
    if get("earlyStoppingPatience") and stage.hasParam("validationIndicatorCol") and \
            not get("validationIndicatorCol"):
        raise _error("earlyStoppingPatience", owner, "0 unless validationIndicatorCol names "
                     "the validation rows it watches", get("earlyStoppingPatience"))
    if stage.hasParam("fitIdentity") and get("fitIdentity") and not get("fitIdentity").strip():
        raise _error("fitIdentity", owner, "a name with a visible character, or \"\" for none",
                     get("fitIdentity"))
    for name, choices in (("device", DEVICES), ("precision", PRECISIONS),
                          ("tuningStrategy", STRATEGIES)):
        if get(name) not in choices:
            raise _error(name, owner, " or ".join(repr(c) for c in choices), get(name))
