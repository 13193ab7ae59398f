"""Spark ML stages on top of the engine: ``NNEstimator``, ``NNModel``, ``NNClassifier``,
``NNClassifierModel``.

Example::

    from sparkdl import NNClassifier
    clf = NNClassifier(model=lambda: torch.nn.Sequential(torch.nn.Linear(4, 3)),
                       criterion=torch.nn.CrossEntropyLoss(), featuresCol="features",
                       labelCol="label", batchSize=64, maxEpoch=5, learningRate=0.01,
                       optimizer="adam", seed=0)
    model = clf.fit(train_df)          # an NNClassifierModel
    model.transform(test_df)           # + prediction (double), probability, rawPrediction
    model.summary                      # per-epoch metrics (pandas)
    model.write().overwrite().save(path); NNClassifierModel.load(path)
"""

from __future__ import annotations

import copy
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import MLReadable, MLWritable
from pyspark.sql import DataFrame
from torch import nn

from ..adapters.pretrained import PretrainedModel, pretrained_origin, trainable_parameters
from ..data.dataframe_arrays import (check_label_column, check_weight_column, feature_sources,
                                     frame_blocks, input_expressions, numpy_float_dtype)
from ..engine.distri_optimizer import DistriOptimizer
from ..engine.fit.resume.fit_identity import params_identity
from ..engine.fit.optim.optimizer_sequence import as_optimizer
from ..engine.fit.optim.rng_isolation import private_torch_rng
from ..executor.step import as_model_input
from ..losses import CLASS_INDEX_LOSSES, IGNORE_INDEX
from ..metrics import prediction_tensor
from ..data.input_record import (FittedInput, check_first_row_widths, check_transform_inputs,
                                 fitted_inputs)
from ..errors import (EmptyDataError, InvalidArgumentError, ModelCriterionMismatchError,
                      TrainingDataError)
from ..storage.file_systems import is_connect_session
from ..task_slots import task_slots
from ..executor.exchange import check_exchange
from ..transport.flat_layout import ParamLayout
from .engine_settings import configure_engine, end_trigger
from .inference import predict_column
from .mlflow_models import training_example
from .fit_together import fit_together
from .mlflow_runs import check_logging
from .params import NNClassifierParams, NNParams, known_keywords, validate_params
from .persistence import NNModelReader, NNModelWriter, NNStageReader, NNStageWriter

__all__ = ["NNEstimator", "NNModel", "NNClassifier", "NNClassifierModel"]

log = logging.getLogger("sparkdl")

ModelSpec = nn.Module | Callable[[], nn.Module]

OBJECT_ARGUMENTS = ("model", "criterion", "preprocess", "optimizerFactory", "augment",
                    "lrScheduler", "initialModel", "collate", "trainingStep", "validationStep")
"""The constructors' arguments that are not JSON Params but objects the estimator holds (in
:meth:`_NNEstimatorBase._set_objects`'s order; ``lrScheduler`` is also a Param)."""


def _torch_optimizer(name: str, params: Any, lr: float, momentum: float,
                     weight_decay: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay)


_FACTORY_KEYWORDS = {"lr": "learningRate", "momentum": "momentum", "weight_decay": "weightDecay"}
"""Keyword arguments an ``optimizerFactory`` may take, and the Params they come from."""


def _optimizer(stage: Any, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of a fit: ``optimizer`` with ``learningRate``, ``momentum`` and
    ``weightDecay``, or ``optimizerFactory(model.parameters(), **keywords)``, given those of
    ``lr``, ``momentum`` and ``weight_decay`` it names (so a tuning grid over ``learningRate``
    reaches it), and ``model`` (the model being trained) if it names it. A factory may return a
    list of optimizers over disjoint parameters (an :class:`~sparkdl.OptimizerSequence`). A
    factory that takes none of the keywords, with any of those Params set, is an error: the
    Params would be silently ignored."""
    get = stage.getOrDefault
    factory = stage.optimizer_factory
    params = (model.parameters() if pretrained_origin(model) is None   # a pretrained base:
              else [p for _, p in trainable_parameters(model)])       # what trains
    if factory is None:
        return _torch_optimizer(get("optimizer"), params, get("learningRate"), get("momentum"),
                                get("weightDecay"))
    signature = inspect.signature(factory).parameters
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in signature.values())
    keywords = {k: get(param) for k, param in _FACTORY_KEYWORDS.items()
                if k in signature or any_keyword}
    extra = {"model": model} if "model" in signature else {}
    ignored = [name for name in ("optimizer", *_FACTORY_KEYWORDS.values())
               if stage.isSet(stage.getParam(name))
               and name not in {_FACTORY_KEYWORDS[k] for k in keywords}]
    if ignored:
        raise InvalidArgumentError(
            f"{type(stage).__name__} has both optimizerFactory and the Param"
            f"{'s' if len(ignored) > 1 else ''} {', '.join(ignored)}, which the factory would "
            "ignore. Either leave them unset, or let the factory take them as keyword "
            "arguments: optimizerFactory=lambda params, lr, momentum, weight_decay: "
            "torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay) "
            "(any of lr, momentum, weight_decay; the optimizer Param cannot be combined).")
    return as_optimizer(factory(params, **keywords, **extra))


class _NNEstimatorBase(Estimator, MLWritable, MLReadable):
    """Shared fit logic; the public classes below only fix what they produce."""

    _classifier = False

    lrScheduler = Param(Params._dummy(), "lrScheduler",
                        "optional optimizer -> torch LR scheduler, stepped after every epoch (a "
                        "Param, so a tuning grid can choose among schedulers; kept in the "
                        "saved stage's objects.pkl, not in its JSON metadata)")
    outerOptimizer = Param(Params._dummy(), "outerOptimizer",
                           "with local rounds, how the averaged delta updates the weights: None "
                           "or 'average' (plain averaging), 'nesterov' (DiLoCo's outer SGD), or "
                           "a callable params -> torch optimizer (kept in the saved stage's "
                           "objects.pkl, not in its JSON metadata)")
    fitIdentity = Param(Params._dummy(), "fitIdentity",
                        "a name for this fit's checkpoints that stands for what sparkdl cannot "
                        "hash (a function closing over a lock or a session); \"\": none needed",
                        typeConverter=TypeConverters.toString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(lrScheduler=None, fitIdentity="", outerOptimizer=None)

    def _take_arguments(self, kwargs: dict[str, Any]) -> None:
        """The constructor's keyword arguments as given: the objects (:data:`OBJECT_ARGUMENTS`)
        held as attributes, the rest set as Params."""
        params = dict(kwargs)
        self._set_objects(*(params.pop(name, None) for name in OBJECT_ARGUMENTS))
        self._set_params(params)

    def _set_params(self, params: dict[str, Any]) -> "_NNEstimatorBase":
        """``setParams``'s keyword arguments as given (``lrScheduler`` checked as by its
        setter)."""
        params = dict(params)
        if "lrScheduler" in params:
            self.setLrScheduler(params.pop("lrScheduler"))
        return self._set(**params)

    def _set_objects(self, model: ModelSpec | None, criterion: Any, preprocess: Any,
                     optimizer_factory: Any, augment: Any = None, lr_scheduler: Any = None,
                     initial_model: Any = None, collate: Any = None, training_step: Any = None,
                     validation_step: Any = None) -> None:
        owner = type(self).__name__
        if model is not None and not isinstance(model, (nn.Module, PretrainedModel)) \
                and not callable(model):
            raise InvalidArgumentError(f"The 'model' argument of {owner} must be a "
                                       "torch.nn.Module or a zero-argument factory returning one. "
                                       f"Got {type(model).__name__} instead.")
        for name, value in (("criterion", criterion), ("preprocess", preprocess),
                            ("optimizerFactory", optimizer_factory), ("augment", augment),
                            ("lrScheduler", lr_scheduler), ("collate", collate),
                            ("trainingStep", training_step),
                            ("validationStep", validation_step)):
            if value is not None and not callable(value):
                raise InvalidArgumentError(f"The '{name}' argument of {owner} must be callable. "
                                           f"Got {type(value).__name__} instead.")
        self.model_spec, self.criterion = model, criterion
        self.preprocess, self.optimizer_factory = preprocess, optimizer_factory
        self.augment, self.collate = augment, collate
        self._set(lrScheduler=lr_scheduler)
        self.training_step, self.validation_step = training_step, validation_step
        self.initial_weights = _initial_weights(owner, initial_model)

    @property
    def lr_scheduler(self) -> Any:
        """The ``lrScheduler`` Param's factory (None: no scheduler)."""
        return self.getOrDefault("lrScheduler")

    def setLrScheduler(self, value: Any) -> "_NNEstimatorBase":
        """Sets :py:attr:`lrScheduler` (``optimizer -> scheduler``, or None)."""
        if value is not None and not callable(value):
            raise InvalidArgumentError(f"The 'lrScheduler' Param of {type(self).__name__} must "
                                       f"be callable. Got {type(value).__name__} instead.")
        return self._set(lrScheduler=value)

    def getLrScheduler(self) -> Any:
        """Gets the value of :py:attr:`lrScheduler` or its default value (None)."""
        return self.getOrDefault("lrScheduler")

    def setOuterOptimizer(self, value: Any) -> "_NNEstimatorBase":
        """Sets :py:attr:`outerOptimizer` (None, "average", "nesterov" or a callable)."""
        return self._set(outerOptimizer=value)

    def getOuterOptimizer(self) -> Any:
        """Gets the value of :py:attr:`outerOptimizer` or its default value (None)."""
        return self.getOrDefault("outerOptimizer")

    def setFitIdentity(self, value: str) -> "_NNEstimatorBase":
        """Sets :py:attr:`fitIdentity`."""
        return self._set(fitIdentity=value)

    def getFitIdentity(self) -> str:
        """Gets the value of :py:attr:`fitIdentity` or its default value (\"\")."""
        return self.getOrDefault("fitIdentity")

    def _fresh_model(self) -> nn.Module:
        spec = self.model_spec
        if spec is None:
            raise InvalidArgumentError(f"{type(self).__name__} has no model: pass model=...")
        if isinstance(spec, PretrainedModel):   # the base stays off the driver
            return spec.driver_model(self.getOrDefault("seed"))
        model = copy.deepcopy(spec) if isinstance(spec, nn.Module) else spec()
        if not isinstance(model, nn.Module):
            raise InvalidArgumentError(f"The 'model' factory of {type(self).__name__} must "
                                       f"return a torch.nn.Module. Got {type(model).__name__}.")
        return model

    def _fit(self, dataset: DataFrame) -> Any:
        fit = self._prepare_fit(dataset, {})
        try:
            fit.engine.optimize()
        except Exception as exc:
            better = fit.explained(exc)
            if better is exc:
                raise
            raise better from exc
        return fit.fitted()

    def _prepare_fit(self, dataset: DataFrame, data_cache: dict[Any, Any]) -> "_PreparedFit":
        """Everything before training: the checks, the model, its optimizer, the data as the
        engine reads it (the same object for every fit of ``data_cache`` that reads the data
        the same way, so that :class:`sparkdl.FitSet` trains them in one pass) and the
        engine."""
        validate_params(self)
        check_logging(self)
        if self.criterion is None and self.training_step is None:
            raise InvalidArgumentError(f"{type(self).__name__} has no criterion: pass "
                                       "criterion=torch.nn.CrossEntropyLoss() or another loss, "
                                       "or trainingStep=(model, inputs, target) -> loss.")
        if self._classifier and isinstance(self.criterion, nn.BCELoss):
            raise InvalidArgumentError(
                f"{type(self).__name__} reads one output per row as a logit (transform's "
                "probability is its sigmoid), but BCELoss takes probabilities: drop the model's "
                "final Sigmoid and use torch.nn.BCEWithLogitsLoss (numerically safer too), or "
                "use NNEstimator.")
        get = self.getOrDefault
        sources = _input_sources(self, dataset)
        label_col = get("labelCol")
        check_label_column(dataset.schema, label_col, self._classifier)
        weight_col = get("weightCol")
        if weight_col:
            check_weight_column(dataset.schema, weight_col)
            if self.training_step is not None:
                raise InvalidArgumentError(
                    f"{type(self).__name__} cannot combine weightCol with trainingStep: pass "
                    "the weight column as the last of inputCols instead, and return "
                    "(weighted loss sum, sum of the weights) from the step.")
        indicator = get("validationIndicatorCol")
        if indicator:
            _check_indicator_column(dataset.schema, indicator)
        with private_torch_rng(get("seed")):   # the same initial weights on any thread
            model = self._fresh_model()
        if self.initial_weights is not None:
            try:
                model.load_state_dict(self.initial_weights)
            except RuntimeError as exc:
                raise InvalidArgumentError(
                    f"The initialModel of {type(self).__name__} does not fit its model: "
                    f"{str(exc).splitlines()[0]} ...") from exc
        optimizer = _optimizer(self, model)    # before any cluster work
        spark = dataset.sparkSession
        connect = is_connect_session(spark)
        if connect:   # before any cluster work: can the weights travel?
            check_exchange(ParamLayout(model).state_bytes, get("exchangeDir"))
        workers = get("numTrainWorkers") or task_slots(spark, get("device"))
        shape = get("featureShape")
        train_df, val_df = dataset, None
        if indicator:
            from pyspark.sql import functions as F

            train_df = dataset.filter(~F.col(indicator))
            val_df = dataset.filter(F.col(indicator))
        float_dtype = numpy_float_dtype(model)
        class_index = isinstance(self.criterion, CLASS_INDEX_LOSSES)
        ignore_label = getattr(self.criterion, "ignore_index", None) if class_index else None
        if self.criterion is None:   # a training step: integer labels stay int64 (class or
            class_index = True       # token indices), -100 (Hugging Face's ignored label) kept
            ignore_label = getattr(self.training_step, "ignore_index", IGNORE_INDEX)

        def blocks(df: DataFrame, part: str) -> Any:   # an RDD on classic sessions,
            # DataFrames on Connect; one object for the fits that read the data the same way
            key = (part, tuple(repr(s) for s in sources), label_col, self._classifier,
                   repr(shape), id(self.preprocess), workers, str(float_dtype), weight_col,
                   class_index, ignore_label, indicator)
            if key not in data_cache:
                data = frame_blocks(df, sources, label_col, self._classifier, shape,
                                    self.preprocess, workers, float_dtype, weight_col,
                                    class_index, ignore_label)
                data_cache[key] = data if connect else data.to_rdd()
            return data_cache[key]

        train_data = blocks(train_df, "training")
        scheduler = self.lr_scheduler(optimizer) if self.lr_scheduler is not None else None
        engine = DistriOptimizer(model, train_data, self.criterion, optimizer,
                                 batch_size=get("batchSize"), end_trigger=end_trigger(self),
                                 lr_scheduler=scheduler,
                                 seed=get("seed"), micro_batch_size=get("microBatchSize") or None,
                                 progress_bar=None if get("progressBar") else False,
                                 device=get("device"), precision=get("precision"),
                                 train_transform=self.augment,
                                 padding_value=get("paddingValue"), collate=self.collate,
                                 sample_weights=bool(weight_col),
                                 exchange_dir=get("exchangeDir") or None,
                                 training_step=self.training_step,
                                 validation_step=self.validation_step,
                                 sub_replicas=get("subReplicas") or None,
                                 local_steps=get("localSteps"),
                                 outer_optimizer=get("outerOptimizer"),
                                 sync_warmup=get("syncWarmup"))
        engine.fit.needs_prediction = True       # transform reads model(*inputs)
        # the fit identity of its checkpoints: the engine's own, plus every Param and the
        # optimizer factory (preprocess is identified by the data it produces)
        engine.fit.identity_extra = params_identity(self, {
            "optimizerFactory": self.optimizer_factory})
        if get("fitIdentity"):
            engine.set_fit_identity(get("fitIdentity"))
        engine.fit.input_names = tuple(s.name for s in sources)   # named in id range errors
        if get("tensorboardDir"):
            engine.set_tensorboard(get("tensorboardDir"))
        configure_engine(self, engine, None if val_df is None else blocks(val_df, "validation"))

        def explained(exc: Exception) -> Exception:
            if isinstance(exc, EmptyDataError):
                return EmptyDataError(_empty_data_message(dataset, indicator, exc.what),
                                      exc.what)
            if isinstance(exc, (TrainingDataError, ModelCriterionMismatchError)):
                names = ", ".join(f"'{s.name}'" for s in sources)
                weights = f", weights: column '{weight_col}'" if weight_col else ""
                return type(exc)(f"{exc} (features: column{'s' if len(sources) > 1 else ''} "
                                 f"{names}, labels: column '{label_col}'{weights})")
            return exc

        def fitted() -> Any:
            trained = engine.model
            out = self._model_class()(trained, self.preprocess, self.collate)
            out.output_size = _output_size(trained, engine)
            out.input_record = fitted_inputs(sources, dataset.schema,
                                             engine.data_spec.feature_shapes,
                                             self.preprocess is None)
            out._resetUid(self.uid)
            self._copyValues(out)
            out.summary_frame = _epoch_summary(engine)
            out.mlflow_run_id, out.training_example = engine.mlflow_run_id, \
                training_example(engine)
            return out

        return _PreparedFit(engine, explained, fitted)

    def fitMultiple(self, dataset: DataFrame, paramMaps: Any) -> Any:
        """Fit one model per param map, together (pyspark's contract: a thread-safe iterator of
        ``(index, model)``). The param maps that read the same columns the same way train in
        one pass over data held once (:class:`sparkdl.FitSet`; the others in passes of their
        own, logged); every model is bitwise the one ``fit`` gives for its param map. With
        ``mlflowLogging`` each fit logs to a child run of the MLflow run active here
        (:mod:`sparkdl.ml.mlflow_runs`).

        Example::

            grid = ParamGridBuilder().addGrid(clf.learningRate, [0.1, 0.01]).build()
            models = dict(clf.fitMultiple(df, grid))      # both trained in one pass
        """
        return fit_together(self, dataset, paramMaps)

    def _model_class(self) -> type:
        return NNClassifierModel if self._classifier else NNModel

    def write(self) -> Any:
        return NNStageWriter(self)

    @classmethod
    def read(cls) -> Any:
        return NNStageReader(cls)


@dataclass
class _PreparedFit:
    """An estimator's fit ready to train: its engine, how its errors are explained in the
    DataFrame's terms, and the fitted model, once the engine trained."""

    engine: DistriOptimizer
    explained: Callable[[Exception], Exception]
    fitted: Callable[[], Any]


def _initial_weights(owner: str, initial: Any) -> dict[str, torch.Tensor] | None:
    """A copy of the weights to start from: ``initialModel`` is a fitted model (anything with a
    ``state_dict()``, e.g. an :class:`NNModel`) or a state dict."""
    if initial is None:
        return None
    state = initial.state_dict() if hasattr(initial, "state_dict") else initial
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise InvalidArgumentError(f"The 'initialModel' argument of {owner} must be a fitted "
                                   "model (NNModel, NNClassifierModel, a torch.nn.Module) or a "
                                   f"state dict. Got {type(initial).__name__} instead.")
    return {k: v.detach().clone() for k, v in state.items()}


def _check_indicator_column(schema: Any, indicator: str) -> None:
    """``validationIndicatorCol`` names a boolean column, before any Spark job."""
    from pyspark.sql.types import BooleanType

    if indicator not in schema.fieldNames():
        raise InvalidArgumentError(f"Column '{indicator}' (validationIndicatorCol) does not "
                                   f"exist; the DataFrame has columns {schema.fieldNames()}.")
    dtype = schema[indicator].dataType
    if not isinstance(dtype, BooleanType):
        raise InvalidArgumentError(
            f"validationIndicatorCol '{indicator}' must be boolean (true for the validation "
            f"rows); it is {dtype.simpleString()}. Cast it: "
            f"df.withColumn('{indicator}', F.col('{indicator}').cast('boolean')).")


def _empty_data_message(dataset: DataFrame, indicator: str, what: str) -> str:
    """Why a fit has no training (or validation) rows, in the DataFrame's terms: one counting
    job, on this error path only."""
    from pyspark.sql import functions as F

    if not indicator:
        return "The DataFrame given to fit has no rows: nothing to train on."
    flag = F.col(indicator)
    rows, true, false = dataset.agg(F.count(F.lit(1)), F.count(F.when(flag, 1)),
                                    F.count(F.when(~flag, 1))).first()
    if rows == 0:
        return "The DataFrame given to fit has no rows: nothing to train on."
    nulls = rows - true - false
    side = "true" if what == "training" else "false"
    counts = (f"is {side} for all {rows} rows" if (true if what == "training" else false) == rows
              else f"is true for {true}, false for {false} and null for {nulls} of the {rows} "
                   "rows (null rows are in neither set)")
    need = "nothing left to train on" if what == "training" else "no row to validate on"
    return f"validationIndicatorCol '{indicator}' {counts}: {need}."


def _input_sources(stage: Any, dataset: DataFrame) -> list[Any]:
    """The model's inputs for ``stage``'s column Params, checked against ``dataset``'s schema."""
    get = stage.getOrDefault
    return feature_sources(dataset.schema, get("featuresCol"), get("featuresCols"),
                           get("inputCols"), get("sequenceCols"))


def _output_size(model: nn.Module, engine: DistriOptimizer) -> int:
    """Values per row of the model's output, from a few training samples (a pretrained
    classifier's base is not on the driver: its config's ``num_labels``)."""
    if pretrained_origin(model) is not None:
        return int(model.config.num_labels)
    was_training = model.training
    model.eval()
    dtype = engine.layout.param_dtype
    with torch.no_grad():
        args = engine.fit.model_arguments(list(engine.data_spec.sample_features))
        out = prediction_tensor(model(*[as_model_input(a, dtype) for a in args]))
    model.train(was_training)
    return int(np.prod(out.shape[1:]))


def _epoch_summary(engine: DistriOptimizer) -> Any:
    import pandas as pd

    rows: dict[int, dict[str, float]] = {}
    for r in engine.summary.iterations:
        row = rows.setdefault(r.epoch, {"epoch": r.epoch, "loss_sum": 0.0, "records": 0,
                                        "iterations": 0, "seconds": 0.0})
        row["loss_sum"] += r.loss * r.records
        row["records"] += r.records
        row["iterations"] += 1
        row["seconds"] += r.wall_s
    for row in rows.values():
        row["train_loss"] = row.pop("loss_sum") / row.pop("records")
    for v in engine.summary.validations:
        for name, value in v.metrics.items():
            rows[v.epoch][f"validation_{name}"] = value
    frame = pd.DataFrame(list(rows.values()))
    timing = ["iterations", "seconds"]          # last: the curves come first
    if frame.empty:
        return frame
    return frame[[c for c in frame.columns if c not in timing] + timing]


class _NNModelBase(Model, MLWritable, MLReadable):
    """Shared transform logic."""

    _classifier = False

    def __init__(self, module: nn.Module | None = None, preprocess: Any = None,
                 collate: Any = None) -> None:
        super().__init__()
        self.module = module
        self.preprocess = preprocess
        self.collate = collate
        self.summary_frame: Any = None
        self.output_size = 0
        self.input_record: list[FittedInput] | None = None
        """What the fit saw of its input columns (:mod:`sparkdl.data.input_record`), which
        ``transform`` checks its DataFrame against; None (no check) for a model built
        directly or saved before the record existed."""
        self.mlflow_run_id: str | None = None
        """The MLflow run the fit logged to (``mlflowLogging``), else None."""
        self.training_example: list[np.ndarray] | None = None
        """A few training rows as the module receives them (the model's arguments), for
        :func:`sparkdl.ml.mlflow_models.log_pytorch_model`; not saved with the model."""

    def merged(self) -> nn.Module:
        """The fitted model with its adapters merged into the base, for a fit of a
        :class:`~sparkdl.adapters.PretrainedModel` with a ``peft`` config: a plain
        ``transformers`` model holding every weight on the driver (the base is read from its
        path), for ``save_pretrained`` or serving without ``peft``
        (:func:`sparkdl.adapters.merged_model`). ``write().save`` writes the adapter alone.

        Example: ``fitted.merged().save_pretrained("/models/merged")``.
        """
        from ..adapters.adapter_files import merged_model

        return merged_model(self.module)

    @property
    def summary(self) -> Any:
        """Per-epoch training loss and validation metrics, then the epoch's iterations and
        their seconds (pandas DataFrame)."""
        return self.summary_frame

    def plot_summary(self, ax: Any = None) -> Any:
        """Plot the per-epoch curves with matplotlib (``pip install sparkdl-torch[plot]``); returns
        the axes.

        Example: ``model.plot_summary().figure.savefig("curves.png")``.
        """
        if self.summary_frame is None or self.summary_frame.empty:
            raise InvalidArgumentError("This model has no training summary to plot.")
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("plot_summary needs matplotlib: pip install matplotlib") from exc

        ax = ax or plt.figure().gca()
        curves = [c for c in self.summary_frame.columns if c not in ("iterations", "seconds")]
        self.summary_frame[curves].set_index("epoch").plot(ax=ax, marker="o")
        ax.set_xlabel("epoch")
        return ax

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights (a copy)."""
        assert self.module is not None
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def _transform(self, dataset: DataFrame) -> DataFrame:
        validate_params(self)
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F

        get = self.getOrDefault
        sources = check_transform_inputs(self.input_record, _input_sources(self, dataset),
                                         dataset.schema)
        check_first_row_widths(dataset, self.input_record, sources)
        assert self.module is not None
        single = self._single_output()
        udf = predict_column(self.module, sources, get("featureShape"), self.preprocess,
                             get("inferenceBatchSize"), self._classifier, single,
                             get("device"), get("precision"), int(self.output_size or 1),
                             get("paddingValue"), self.collate,
                             self._model_exchange(dataset.sparkSession),
                             [r.width for r in self.input_record] if self.input_record else None)
        float_type = "double" if numpy_float_dtype(self.module) == np.float64 else "float"
        tmp = "_sparkdl_output"
        out = dataset.withColumn(tmp, udf(*input_expressions(sources, float_type)))
        if self._classifier:
            for param, field, as_vector in (("rawPredictionCol", "raw", True),
                                            ("probabilityCol", "probability", True),
                                            ("predictionCol", "prediction", False)):
                name = get(param)
                if name:
                    value = F.col(f"{tmp}.{field}")
                    out = out.withColumn(name, array_to_vector(value) if as_vector else value)
        elif get("predictionCol"):
            out = out.withColumn(get("predictionCol"), F.col(tmp))
        return out.drop(tmp)

    def _single_output(self) -> bool:
        return False

    def _model_exchange(self, spark: Any) -> str | None:
        """Under Spark Connect, where a model too large for a job's function travels
        (``exchangeDir``; an error before any cluster work when it is needed and not set)."""
        if not is_connect_session(spark):
            return None
        assert self.module is not None
        check_exchange(ParamLayout(self.module).state_bytes, self.getOrDefault("exchangeDir"))
        return self.getOrDefault("exchangeDir") or None

    def write(self) -> Any:
        return NNModelWriter(self)

    @classmethod
    def read(cls) -> Any:
        return NNModelReader(cls)

    @classmethod
    def load(cls, path: str, model: Callable[[], nn.Module] | None = None,
             preprocess: Any = None, collate: Any = None) -> Any:
        """Load a model saved with ``write().save(path)``.

        Without ``model`` the saved architecture (``module.pkl``) is unpickled: like any pickle
        it can run code, so only load models you trust. With ``model``, a zero-argument factory
        building the same architecture, nothing is unpickled: only the weights
        (``weights.pt``, ``torch.load(weights_only=True)``) and the JSON metadata are read, and
        ``preprocess`` and ``collate`` are the ones given here.

        Example: ``NNClassifierModel.load(path, model=lambda: MyNet(hidden=64))``.
        """
        return NNModelReader(cls, model, preprocess, collate).load(path)


class NNEstimator(_NNEstimatorBase, NNParams):
    """Train a PyTorch model on a DataFrame with sparkdl's engine (regression or any loss).

    Args:
        model: an ``nn.Module`` (copied, never mutated) or a zero-argument factory; or a
            :class:`sparkdl.adapters.PretrainedModel` (the executors load its base; the driver
            builds its adapters with the ``seed`` Param).
        criterion: the loss, e.g. ``torch.nn.MSELoss()``.
        preprocess: optional function applied to each batch of features (numpy) on the executors.
        optimizerFactory: optional ``params -> torch.optim.Optimizer``, used instead of
            ``optimizer``; it may take keyword arguments ``lr``, ``momentum``, ``weight_decay``,
            given from ``learningRate``, ``momentum``, ``weightDecay`` (so tuning grids reach
            it); setting those Params for a factory that does not take them is an error. A
            factory that takes ``model`` is given the model being trained, and may return a
            list of optimizers over disjoint parameters (SparseAdam for tables built with
            ``sparse=True``, Adam for the rest): ``lambda params, lr, model:
            [torch.optim.SparseAdam(model.tables.parameters(), lr=lr),
            torch.optim.Adam(model.head.parameters(), lr=lr)]``.
        augment: optional ``(features, rng) -> features`` run in the tasks on every training
            batch (after ``preprocess``; the list of arrays with ``inputCols``), ``rng`` a numpy
            Generator seeded by (seed, iteration, partition): bitwise reproducible, never
            applied to validation rows or in ``transform``.
        lrScheduler: optional ``optimizer -> torch LR scheduler``, stepped after every epoch;
            with several optimizers it is given their :class:`~sparkdl.OptimizerSequence` and
            may return a list of schedulers over ``optimizer.optimizers``.
        initialModel: optional warm start: a fitted model (or a state dict) whose weights the
            new model starts from instead of its own initialisation.
        collate: optional ``(inputs) -> model arguments`` for batches with ``sequenceCols``
            (instead of padded tensor + lengths; see :mod:`sparkdl.data.ragged`); also used by
            the fitted model's ``transform``.
        trainingStep: optional ``(model, inputs, target) -> loss`` used instead of
            ``criterion(model(*inputs), target)`` (then ``criterion`` is optional): the loss is
            the mean over the rows, or ``(loss_sum, normaliser)``
            (:mod:`sparkdl.training_step`; adapters for Hugging Face and Lightning in
            :mod:`sparkdl.adapters`). Without a criterion, the validation ``"loss"`` is the
            step's loss. ``transform`` still calls ``model(*inputs)`` (a dict-like output is
            read at its ``"logits"``).
        validationStep: optional ``(model, inputs, target) -> output`` replacing
            ``model(*inputs)`` for the validation metrics.

    Every Param (``featuresCol`` to ``mlflowLogging`` in the signature) is a keyword argument
    with its default (``explainParams()`` says what each does; the configuration page lists them
    with the engine's names); ``setParams`` takes the same keywords. An unknown keyword is an
    :class:`~sparkdl.InvalidArgumentError` naming the Params.

    Example::

        est = NNEstimator(model=torch.nn.Linear(3, 1), criterion=torch.nn.MSELoss(),
                          featuresCols=["a", "b", "c"], labelCol="y", maxEpoch=5)
        predictions = est.fit(df).transform(df)   # + "prediction" (double)
    """

    # the defaults shown are the Params' defaults; @keyword_only passes on only the arguments
    # given, so a default (the lists included) is never stored or shared
    @known_keywords
    @keyword_only
    def __init__(self, *, model: ModelSpec | None = None,
                 criterion: Callable[..., Any] | None = None,
                 preprocess: Callable[..., Any] | None = None,
                 optimizerFactory: Callable[..., Any] | None = None,
                 augment: Callable[..., Any] | None = None,
                 lrScheduler: Callable[[Any], Any] | None = None, initialModel: Any = None,
                 collate: Callable[..., Any] | None = None,
                 trainingStep: Callable[..., Any] | None = None,
                 validationStep: Callable[..., Any] | None = None, featuresCol: str = "features",
                 featuresCols: list[str] = [], inputCols: list[str] = [],
                 sequenceCols: list[str] = [], featureShape: list[int] = [],
                 paddingValue: float = 0.0, labelCol: str = "label", weightCol: str = "",
                 predictionCol: str = "prediction", validationIndicatorCol: str = "",
                 batchSize: int = 128, maxEpoch: int = 10, learningRate: float = 0.001,
                 optimizer: str = "adam", momentum: float = 0.0, weightDecay: float = 0.0,
                 seed: int = 0, gradientClipNorm: float = 0.0, microBatchSize: int = 0,
                 earlyStoppingPatience: int = 0, restoreBest: bool = True,
                 validationMetrics: list[str] = [], localSteps: int = 1, syncWarmup: int = 0,
                 outerOptimizer: str | Callable[..., Any] | None = None, numTrainWorkers: int = 0,
                 subReplicas: int = 0, device: str = "auto", precision: str = "32",
                 inferenceBatchSize: int = 1024, checkpointDir: str = "", fitIdentity: str = "",
                 exchangeDir: str = "", tuningStrategy: str = "together", progressBar: bool = True,
                 tensorboardDir: str = "", mlflowLogging: bool = False) -> None:
        super().__init__()
        self._take_arguments(self._input_kwargs)

    @known_keywords
    @keyword_only
    def setParams(self, *, featuresCol: str = "features", featuresCols: list[str] = [],
                  inputCols: list[str] = [], sequenceCols: list[str] = [],
                  featureShape: list[int] = [], paddingValue: float = 0.0, labelCol: str = "label",
                  weightCol: str = "", predictionCol: str = "prediction",
                  validationIndicatorCol: str = "", batchSize: int = 128, maxEpoch: int = 10,
                  learningRate: float = 0.001, optimizer: str = "adam", momentum: float = 0.0,
                  weightDecay: float = 0.0, seed: int = 0, gradientClipNorm: float = 0.0,
                  microBatchSize: int = 0, lrScheduler: Callable[[Any], Any] | None = None,
                  earlyStoppingPatience: int = 0, restoreBest: bool = True,
                  validationMetrics: list[str] = [], localSteps: int = 1, syncWarmup: int = 0,
                  outerOptimizer: str | Callable[..., Any] | None = None, numTrainWorkers: int = 0,
                  subReplicas: int = 0, device: str = "auto", precision: str = "32",
                  inferenceBatchSize: int = 1024, checkpointDir: str = "", fitIdentity: str = "",
                  exchangeDir: str = "", tuningStrategy: str = "together",
                  progressBar: bool = True, tensorboardDir: str = "",
                  mlflowLogging: bool = False) -> "NNEstimator":
        """Sets the given Params (only those named; the others keep their values).

        Example: ``est.setParams(batchSize=64, maxEpoch=3, learningRate=0.01)``.
        """
        return self._set_params(self._input_kwargs)


class NNModel(_NNModelBase, NNParams):
    """A fitted :class:`NNEstimator`: writes ``predictionCol`` (double for one output per row,
    else array<double>).

    Example: ``NNModel.load(path).transform(df)``.
    """

    def _single_output(self) -> bool:
        return int(getattr(self, "output_size", 0) or 1) == 1


class NNClassifier(_NNEstimatorBase, NNClassifierParams):
    """Train a PyTorch classifier on a DataFrame; labels are 0-based class indices.

    Takes the same arguments as :class:`NNEstimator` plus ``probabilityCol`` and
    ``rawPredictionCol``. The fitted :class:`NNClassifierModel` writes ``prediction`` (double),
    ``probability`` and ``rawPrediction`` (ML Vectors), so Spark's evaluators work unchanged.

    Example::

        clf = NNClassifier(model=lambda: torch.nn.Linear(4, 3),
                           criterion=torch.nn.CrossEntropyLoss(), maxEpoch=5, seed=0)
        acc = MulticlassClassificationEvaluator().evaluate(clf.fit(train).transform(test))
    """

    _classifier = True

    # the defaults shown are the Params' defaults; @keyword_only passes on only the arguments
    # given, so a default (the lists included) is never stored or shared
    @known_keywords
    @keyword_only
    def __init__(self, *, model: ModelSpec | None = None,
                 criterion: Callable[..., Any] | None = None,
                 preprocess: Callable[..., Any] | None = None,
                 optimizerFactory: Callable[..., Any] | None = None,
                 augment: Callable[..., Any] | None = None,
                 lrScheduler: Callable[[Any], Any] | None = None, initialModel: Any = None,
                 collate: Callable[..., Any] | None = None,
                 trainingStep: Callable[..., Any] | None = None,
                 validationStep: Callable[..., Any] | None = None, featuresCol: str = "features",
                 featuresCols: list[str] = [], inputCols: list[str] = [],
                 sequenceCols: list[str] = [], featureShape: list[int] = [],
                 paddingValue: float = 0.0, labelCol: str = "label", weightCol: str = "",
                 predictionCol: str = "prediction", probabilityCol: str = "probability",
                 rawPredictionCol: str = "rawPrediction", validationIndicatorCol: str = "",
                 batchSize: int = 128, maxEpoch: int = 10, learningRate: float = 0.001,
                 optimizer: str = "adam", momentum: float = 0.0, weightDecay: float = 0.0,
                 seed: int = 0, gradientClipNorm: float = 0.0, microBatchSize: int = 0,
                 earlyStoppingPatience: int = 0, restoreBest: bool = True,
                 validationMetrics: list[str] = [], localSteps: int = 1, syncWarmup: int = 0,
                 outerOptimizer: str | Callable[..., Any] | None = None, numTrainWorkers: int = 0,
                 subReplicas: int = 0, device: str = "auto", precision: str = "32",
                 inferenceBatchSize: int = 1024, checkpointDir: str = "", fitIdentity: str = "",
                 exchangeDir: str = "", tuningStrategy: str = "together", progressBar: bool = True,
                 tensorboardDir: str = "", mlflowLogging: bool = False) -> None:
        super().__init__()
        self._take_arguments(self._input_kwargs)

    @known_keywords
    @keyword_only
    def setParams(self, *, featuresCol: str = "features", featuresCols: list[str] = [],
                  inputCols: list[str] = [], sequenceCols: list[str] = [],
                  featureShape: list[int] = [], paddingValue: float = 0.0, labelCol: str = "label",
                  weightCol: str = "", predictionCol: str = "prediction",
                  probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                  validationIndicatorCol: str = "", batchSize: int = 128, maxEpoch: int = 10,
                  learningRate: float = 0.001, optimizer: str = "adam", momentum: float = 0.0,
                  weightDecay: float = 0.0, seed: int = 0, gradientClipNorm: float = 0.0,
                  microBatchSize: int = 0, lrScheduler: Callable[[Any], Any] | None = None,
                  earlyStoppingPatience: int = 0, restoreBest: bool = True,
                  validationMetrics: list[str] = [], localSteps: int = 1, syncWarmup: int = 0,
                  outerOptimizer: str | Callable[..., Any] | None = None, numTrainWorkers: int = 0,
                  subReplicas: int = 0, device: str = "auto", precision: str = "32",
                  inferenceBatchSize: int = 1024, checkpointDir: str = "", fitIdentity: str = "",
                  exchangeDir: str = "", tuningStrategy: str = "together",
                  progressBar: bool = True, tensorboardDir: str = "",
                  mlflowLogging: bool = False) -> "NNClassifier":
        """Sets the given Params (only those named; the others keep their values).

        Example: ``clf.setParams(batchSize=64, maxEpoch=3, learningRate=0.01)``.
        """
        return self._set_params(self._input_kwargs)


class NNClassifierModel(_NNModelBase, NNClassifierParams):
    """A fitted :class:`NNClassifier`.

    Example::

        model = NNClassifierModel.load(path)
        model.transform(df).select("prediction", "probability")
    """

    _classifier = True
