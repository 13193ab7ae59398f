"""What is trained: one fit, as an object (driver side).

A :class:`Fit` holds everything that decides a fit's result and how it is reported: the model,
its training data, the loss (criterion or training step), the optimizer(s) and scheduler(s), the
settings, the end trigger, and what the setters add (validation, checkpoints, clipping, MLflow,
a name for its identity). It knows nothing of how it is run: a strategy
(:mod:`sparkdl.engine.strategies`) opens it on a runner (:mod:`sparkdl.engine.fit.opening`)
and drives it. :class:`sparkdl.DistriOptimizer` is the public facade that checks the user's
arguments and fills one (:mod:`sparkdl.engine.fit.building`); the estimators fill
theirs through it and mark what they need here (``needs_prediction``, ``identity_extra``,
``input_names``).

Example::

    fit = DistriOptimizer(net, rdd, loss, opt, batch_size=64).fit     # a Fit
    fit.end_trigger, fit.settings.batch_size, fit.summary
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from ...argument_checks import check_int, check_positive_int
from ...data.ragged import model_arguments
from ...errors import InvalidArgumentError
from ...storage.checkpoint_store import CheckpointStore
from ...transport.flat_layout import ParamLayout
from ...triggers import Trigger
from .checks.data_checks import DataSpec, sample_batch
from .checks.task_parallelism import concurrency_hazard
from .reports.summary import TrainingSummary
from .run_context import RunSettings

__all__ = ["Fit", "ARGUMENTS", "fit_of"]

ARGUMENTS = ("model", "training_rdd", "criterion", "optimizer", "batch_size", "end_trigger",
             "seed", "lr_scheduler", "lr_scheduler_step", "micro_batch_size", "shuffle",
             "allreduce", "num_blocks", "progress_bar", "compression", "device", "precision",
             "train_transform", "sequence_inputs", "padding_value", "collate", "sample_weights",
             "exchange_dir", "training_step", "validation_step", "sub_replicas", "local_steps",
             "outer_optimizer", "sync_warmup")
"""The arguments of :class:`sparkdl.DistriOptimizer`, in order: each is found on a Fit, its
``settings`` or their ``runner_options`` under its own name (the fit identity reads them)."""

OWNER = "DistriOptimizer"


class Fit:
    """One fit: what is trained (see the module docstring). Built by
    :func:`sparkdl.engine.fit.building.fit_from_arguments` from checked
    arguments; the setters' state starts empty."""

    def __init__(self, model: nn.Module, training_rdd: Any, criterion: Any, reduction: str,
                 optimizer: Any, end_trigger: Trigger, lr_scheduler: Any,
                 settings: RunSettings, train_transform: Any = None,
                 sequence_inputs: tuple[int, ...] = (), padding_value: float = 0.0,
                 collate: Any = None, exchange_dir: str | None = None,
                 sub_replicas: int | None = None, training_step: Any = None,
                 validation_step: Any = None) -> None:
        self.model, self.training_rdd = model, training_rdd
        self.criterion, self.reduction = criterion, reduction
        self.optimizer, self.end_trigger, self.lr_scheduler = optimizer, end_trigger, lr_scheduler
        self.settings = settings
        self.train_transform, self.sequence_inputs = train_transform, sequence_inputs
        self.padding_value, self.collate = padding_value, collate
        self.exchange_dir, self.sub_replicas = exchange_dir, sub_replicas
        self.training_step, self.validation_step = training_step, validation_step
        self.layout = ParamLayout(model)
        self.local_steps = 1
        """H, the iterations of a local round (1: synchronous SGD unless ``outer_optimizer``)."""
        self.outer_optimizer: Any = None
        """The local rounds' outer optimizer as given (None, "average", "nesterov", a
        callable)."""
        self.sync_warmup = 0
        """Synchronous iterations before the local rounds begin (post-local SGD)."""
        self.validation: Any = None
        """:class:`sparkdl.engine.fit.validation.Validation`, or None."""
        self.checkpoint_setup: Any = None
        """:class:`sparkdl.engine.fit.resume.checkpointing.CheckpointSetup`, or None."""
        self.clipping: Any = None
        """:class:`sparkdl.engine.fit.optim.clipping.GradientClipping`, or None."""
        self.mlflow: Any = None
        """:class:`sparkdl.engine.fit.reports.mlflow_tracking.MlflowSetup`, or None."""
        self.name: str | None = None
        """The explicit identity (``set_fit_identity``), or None."""
        self.identity_extra: dict[str, Any] | None = None
        """What a caller adds to the fit identity (the estimators: their Params)."""
        self.needs_prediction = False
        """Whether ``model(*inputs)`` must give a prediction tensor even with a training step
        (the estimators' ``transform``): checked by the dry run, before training."""
        self.input_names: tuple[str, ...] = ()
        """The features' column names (the estimators), for the errors of embedding ids out of
        their table's range (:mod:`sparkdl.executor.id_checks`)."""
        self.summary = TrainingSummary()
        self.iteration = 0
        self.data_spec: DataSpec | None = None
        self.mlflow_run_id: str | None = None

    # ------------------------------------------------------------------ settings by name
    @property
    def batch_size(self) -> int:
        """The global mini-batch size (may be set before training)."""
        return self.settings.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.settings = dataclasses.replace(
            self.settings, batch_size=check_positive_int("batch_size", OWNER, value))

    @property
    def seed(self) -> int:
        """The run's seed (may be set before training)."""
        return self.settings.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.settings = dataclasses.replace(self.settings, seed=check_int("seed", OWNER, value))

    # ------------------------------------------------------------------ what it computes with
    def model_arguments(self, features: list[Any]) -> list[Any]:
        """The model's arguments for a batch's ``features`` (the sample weights left out)."""
        if self.settings.sample_weights:        # the last input is the samples' weight
            features = features[:-1]
        return model_arguments(features, self.padding_value, self.collate)

    def concurrency_hazard(self) -> str | None:
        """Why sub-replicas cannot train this model exactly (None: they can), tried on the
        training rows the dry run used."""
        assert self.data_spec is not None
        if any(p.is_meta for p in self.model.parameters()):
            return "its pretrained base is not on the driver, where the check runs"
        inputs, target = sample_batch(self.data_spec, self.layout.param_dtype,
                                      self.model_arguments)
        return concurrency_hazard(self.model, self.criterion, self.training_step, inputs, target)

    def check_trigger_metrics(self) -> None:
        """Every validation metric a trigger reads must be computed by ``set_validation``."""
        triggers = [("end_trigger", self.end_trigger)]
        if self.checkpoint_setup is not None:
            triggers.append(("checkpoint trigger", self.checkpoint_setup.trigger))
        if self.validation is not None:
            triggers.append(("validation trigger", self.validation.trigger))
        validated = {m.name for m in self.validation.metrics} if self.validation else set()
        for what, trigger in triggers:
            missing = sorted(trigger.metric_names() - validated)
            if missing:
                raise InvalidArgumentError(
                    f"The {what} {trigger!r} reads the validation metric {missing[0]!r}, which "
                    + (f"set_validation does not compute (it computes {sorted(validated)})"
                       if validated else "is never computed: call set_validation(data, trigger, "
                       "[...]) with that metric") + ".")

    def checkpoint_store(self, path: str) -> CheckpointStore:
        """The checkpoint directory ``path``, reached as the training data's session reaches
        files (Spark's Hadoop file systems; pyarrow's without a JVM)."""
        from ...runners.in_process import LocalPartitions
        from ...storage.arrow_files import ArrowFiles
        from ...storage.hadoop_files import HadoopFiles

        data = self.training_rdd
        # without Spark (LocalPartitions) or a JVM (Spark Connect): pyarrow's file systems
        sc = None if isinstance(data, LocalPartitions) else getattr(data, "context", None)
        return CheckpointStore(path, HadoopFiles(sc) if sc is not None else ArrowFiles())


def fit_of(value: Any) -> Fit | None:
    """The :class:`Fit` that ``value`` is or holds (a :class:`sparkdl.DistriOptimizer`), or
    None."""
    if isinstance(value, Fit):
        return value
    held = getattr(value, "__dict__", {}).get("fit")
    return held if isinstance(held, Fit) else None
