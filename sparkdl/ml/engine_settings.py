"""The estimators' Params and constructor arguments turned into engine settings (driver side).

:func:`configure_engine` takes a :class:`~sparkdl.engine.distri_optimizer.DistriOptimizer` built
by ``fit`` and applies what the estimator was asked for: validation metrics by name, early
stopping on the validation rows, gradient clipping, checkpoints (resumed by default, like the
engine), MLflow logging (:mod:`sparkdl.ml.mlflow_runs`). :func:`end_trigger` and :func:`validation_metrics` are also used by ``fit`` itself.

Example::

    engine = DistriOptimizer(model, rdd, criterion, optimizer, batch_size=64,
                             end_trigger=end_trigger(stage))
    configure_engine(stage, engine, validation_rdd)
"""

from __future__ import annotations

from typing import Any

from ..metrics import MAE, Loss, Top1Accuracy, ValidationMetric
from ..triggers import EarlyStopping, EveryEpoch, MaxEpoch, Trigger
from .mlflow_runs import configure_mlflow

__all__ = ["METRIC_NAMES", "validation_metrics", "end_trigger", "configure_engine",
           "CHECKPOINTS_KEPT"]

METRIC_NAMES = ("loss", "accuracy", "mae")
"""Names ``validationMetrics`` accepts: the criterion's mean, top-1 accuracy (one output per row
is a logit: class 1 when it is > 0, as in ``transform``; a probability under ``BCELoss``), mean absolute error."""

CHECKPOINTS_KEPT = 2
"""Checkpoints an estimator keeps in ``checkpointDir`` (one is written after every epoch)."""


def _metric(name: str) -> ValidationMetric:
    if name == "loss":
        return Loss()
    if name == "accuracy":
        return Top1Accuracy()
    return MAE()


def validation_metrics(stage: Any) -> list[ValidationMetric]:
    """The metrics computed on the validation rows: ``validationMetrics``, or by default the
    loss (and the accuracy for a classifier). The loss always comes first (early stopping
    watches it)."""
    names = list(stage.getOrDefault("validationMetrics")) or (
        ["loss", "accuracy"] if stage._classifier else ["loss"])
    ordered = ["loss"] + [n for n in names if n != "loss"]
    return [_metric(n) for n in ordered]


def end_trigger(stage: Any) -> Trigger:
    """``maxEpoch`` epochs, or fewer when ``earlyStoppingPatience`` validations in a row did not
    improve the validation loss."""
    trigger: Trigger = MaxEpoch(stage.getOrDefault("maxEpoch"))
    patience = stage.getOrDefault("earlyStoppingPatience")
    if patience:
        trigger = trigger | EarlyStopping("Loss", patience, "min",
                                          restore_best=stage.getOrDefault("restoreBest"))
    return trigger


def configure_engine(stage: Any, engine: Any, validation_data: Any) -> None:
    """Validation (every epoch, when there are validation rows), clipping, checkpoints and
    MLflow logging."""
    get = stage.getOrDefault
    if validation_data is not None:
        engine.set_validation(validation_data, EveryEpoch(), validation_metrics(stage))
    if get("gradientClipNorm"):
        engine.set_gradient_clipping(get("gradientClipNorm"))
    if get("checkpointDir"):
        # each fit (a setting, a fold of a tuning grid) in its own subdirectory, by its key
        engine.set_checkpoint(get("checkpointDir"), EveryEpoch(), keep_last=CHECKPOINTS_KEPT,
                              resume=True, by_fit=True)
    configure_mlflow(stage, engine)
