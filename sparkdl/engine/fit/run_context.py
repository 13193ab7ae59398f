"""Everything one training run needs, in one object the loop's parts share (driver side).

:class:`RunSettings` holds the user's choices that fix a run's arithmetic and reporting;
:class:`RunContext` adds the torch objects, the runner and its data, the batch plan, the optional
validation and checkpointing, and what changes as the run goes (the iteration, the summary).
:func:`sparkdl.engine.fit.opening.open_fit` builds one when a fit opens; the fit's lifecycle
(:mod:`sparkdl.engine.fit.lifecycle`) and its strategy's steps (:mod:`sparkdl.engine.strategies`)
share it.

Example::

    ctx = RunContext(settings, model, criterion, "mean", optimizer, None, ParamLayout(model),
                     MaxEpoch(1), runner, train, BatchPlan([50, 50], 20, 0))
    SyncStep(ctx, FitLifecycle(ctx))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ...data.batch_plan import BatchPlan
from ...losses import divided_on_driver
from ...transport.flat_layout import ParamLayout
from ...triggers import Trigger
from ...runners.interface import DataHandle, IterationRunner, RunnerOptions
from .reports.summary import TrainingSummary

__all__ = ["RunSettings", "RunContext", "KEY_DEFAULTS"]


@dataclass(frozen=True)
class RunSettings:
    """The user's settings of a run (validated by :class:`sparkdl.DistriOptimizer`)."""

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    micro_batch_size: int | None = None
    lr_scheduler_step: str = "epoch"
    runner_options: RunnerOptions = field(default_factory=RunnerOptions)
    progress_bar: bool | None = None
    tensorboard_dir: str | None = None
    sample_weights: bool = False
    sub_replicas: int = 1
    """Sub-replicas per task (:mod:`sparkdl.engine.fit.checks.task_parallelism`), decided at
    the run's start (the DistriOptimizer's own setting is the user's request, None for
    automatic)."""

    def reproducibility_key(self, plan: BatchPlan) -> dict[str, Any]:
        """What a resumed run must share with the checkpointed one to reproduce it bitwise."""
        options = self.runner_options
        return {"seed": self.seed, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "partition_sizes": [int(n) for n in plan.partition_sizes],
                "micro_batch_size": self.micro_batch_size,
                "lr_scheduler_step": self.lr_scheduler_step,
                "compression": options.compression, "precision": options.precision,
                "sub_replicas": self.sub_replicas}


KEY_DEFAULTS: dict[str, Any] = {"micro_batch_size": None, "lr_scheduler_step": "epoch",
                                "compression": None, "precision": "32", "sub_replicas": 1,
                                "strategy": "together"}
"""What checkpoints written before a setting joined the key had (they could not differ;
``strategy`` is only in the keys of fits trained by model hopping)."""


@dataclass
class RunContext:
    """One run: settings, torch objects, where the jobs run, and the run's progress."""

    settings: RunSettings
    model: nn.Module
    criterion: Any
    reduction: str
    optimizer: Any
    lr_scheduler: Any
    layout: ParamLayout
    end_trigger: Trigger
    runner: IterationRunner
    train: DataHandle
    plan: BatchPlan
    validation: Any = None        # sparkdl.engine.fit.validation.Validation, or None
    checkpoints: Any = None       # sparkdl.engine.fit.resume.checkpointing.Checkpoints, or None
    clipping: Any = None          # sparkdl.engine.fit.optim.clipping.GradientClipping, or None
    loss_scaler: Any = None       # sparkdl.engine.fit.optim.loss_scaling.LossScaler for "16-mixed"
    listeners: list[Any] = field(default_factory=list)
    """Also fed every iteration and validation record (the MLflow tracker), owned by the
    caller."""
    summary: TrainingSummary = field(default_factory=TrainingSummary)
    iteration: int = 0
    training_step: Any = None
    """The user's training step (:mod:`sparkdl.training_step`), or None for the criterion."""
    fit_key: dict[str, Any] = field(default_factory=dict)
    """The fit's data, hyperparameters and initial weights
    (:mod:`sparkdl.engine.fit.resume.fit_identity`)."""
    strategy_key: dict[str, Any] = field(default_factory=dict)
    """The strategy's own settings in the resume key (``{"strategy": ...}`` for a hop; none
    for the plain one): :meth:`sparkdl.engine.strategies.base.Strategy.resume_key`."""
    strategy_state: Any = None
    """The strategy's own state that a checkpoint keeps (an object with ``state_dict()``, set
    by the strategy's driver; None for strategies whose state is all in the model and
    optimizer): the local rounds' inner and outer optimizer states."""
    resumed_strategy_state: dict[str, Any] | None = None
    """That state as the resumed checkpoint held it, until the strategy's driver takes it."""
    best_states: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Weights kept for early stops with ``restore_best``, by the trigger's position among the
    end trigger's EarlyStopping triggers."""

    @property
    def normalised_loss(self) -> bool:
        """The tasks report the loss's normaliser and the loop divides by the union's
        (:mod:`sparkdl.losses`)."""
        return self.training_step is not None or divided_on_driver(
            self.criterion, self.reduction, self.settings.sample_weights)

    def resume_key(self) -> dict[str, Any]:
        """What a checkpoint must have been written with for this run to resume it."""
        # the settings as the run resolved them (sub_replicas: the count chosen, not None)
        return self.fit_key | self.settings.reproducibility_key(self.plan) | self.strategy_key
