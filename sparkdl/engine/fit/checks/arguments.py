"""Checks of the engine's own kinds of arguments: training data, criterion, optimizer, LR
scheduler (driver side, at construction, before any cluster work). Plain values (ints, choices,
types) use :mod:`sparkdl.argument_checks`, so all messages share one template.

Example::

    reduction = check_criterion("DistriOptimizer", torch.nn.CrossEntropyLoss())   # "mean"
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ....argument_checks import argument_error
from ....errors import InvalidArgumentError
from ..optim.optimizer_sequence import (SchedulerSequence, required_step_arguments,
                                 scheduler_needs_metric)

__all__ = ["check_training_data", "check_criterion", "check_steps", "check_optimizer",
           "check_lr_scheduler"]


def check_training_data(name: str, owner: str, value: Any) -> Any:
    """An RDD of records, or :class:`sparkdl.runners.LocalPartitions` to run in process (or the
    estimators' :class:`~sparkdl.data.dataframe_arrays.DataFrameBlocks`)."""
    from pyspark import RDD

    from ....data.dataframe_arrays import DataFrameBlocks
    from ....runners.in_process import LocalPartitions
    from ....storage.file_systems import is_connect_object

    if isinstance(value, (RDD, LocalPartitions, DataFrameBlocks)):
        return value
    # a Connect DataFrame is refused for what it is, on any pyspark (upgrading would not help)
    if type(value).__name__ == "DataFrame" and \
            is_connect_object(getattr(value, "sparkSession", None)):
        raise InvalidArgumentError(
            f"The '{name}' argument of {owner} is a Spark Connect DataFrame. The engine API "
            "trains on RDDs, which Spark Connect does not have: under Spark Connect use the "
            "estimators, sparkdl.NNEstimator or sparkdl.NNClassifier, which take the same "
            "model, criterion and optimizer settings and run through DataFrame operations.")
    if type(value).__name__ == "DataFrame":
        hint = (" For a DataFrame use sparkdl.NNEstimator, or pass "
                "df.rdd.map(lambda row: (features, label)).")
    else:
        hint = (" To train without Spark, in this process, pass the partitions as "
                "sparkdl.runners.LocalPartitions([records_0, records_1, ...]).")
    raise InvalidArgumentError(
        f"The '{name}' argument of {owner} must be a pyspark RDD of (features, label) pairs. "
        f"Got {type(value).__name__} instead.{hint}")


def check_steps(owner: str, criterion: Any, training_step: Any, validation_step: Any,
                sample_weights: bool) -> tuple[Any, Any]:
    """``training_step`` and ``validation_step`` (:mod:`sparkdl.training_step`): functions or
    None; a run needs a criterion or a training step."""
    for name, step in (("training_step", training_step), ("validation_step", validation_step)):
        if step is not None and not callable(step):
            raise argument_error(name, owner, "a function (model, inputs, target) -> "
                                 + ("loss" if name == "training_step" else "output"), step)
    if criterion is None and training_step is None:
        raise InvalidArgumentError(
            f"{owner} needs a criterion (a loss such as torch.nn.CrossEntropyLoss()) or a "
            "training_step (a function (model, inputs, target) -> loss); both are missing.")
    if training_step is not None and sample_weights:
        raise InvalidArgumentError(
            f"{owner}: sample_weights=True cannot be combined with a training_step. Keep "
            "sample_weights=False: each record's weight then reaches the step as its last "
            "input; weight the loss terms there and return (weighted loss sum, sum of the "
            "weights).")
    return training_step, validation_step


def check_criterion(owner: str, criterion: Any) -> str:
    """The criterion's reduction ('mean' or 'sum')."""
    if not callable(criterion):
        raise argument_error("criterion", owner, "a callable loss such as "
                             "torch.nn.CrossEntropyLoss()", criterion)
    reduction = getattr(criterion, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise InvalidArgumentError(
            f"The 'criterion' argument of {owner} must reduce to a scalar (reduction 'mean' or "
            f"'sum'). Got reduction={reduction!r} instead.")
    return reduction


def check_optimizer(owner: str, optimizer: Any, model: nn.Module) -> torch.optim.Optimizer:
    """``optimizer`` if it is a torch optimizer over ``model``'s own parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise argument_error("optimizer", owner, "a torch.optim.Optimizer built over "
                             "model.parameters()", optimizer)
    own = {id(p) for p in model.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in own:
                raise InvalidArgumentError(
                    f"The 'optimizer' argument of {owner} must be built over the model's own "
                    "parameters (torch.optim.X(model.parameters(), ...)); it holds a tensor of "
                    f"shape {tuple(p.shape)} that is not a parameter of the model.")
    return optimizer


def check_lr_scheduler(owner: str, scheduler: Any, optimizer: torch.optim.Optimizer) -> Any:
    """``scheduler`` (or None) if it was built over ``optimizer`` and the engine can step it:
    without arguments, or with one metric (it is given a loss, so ``ReduceLROnPlateau`` must
    have ``mode='min'``)."""
    if scheduler is None:
        return None
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise argument_error("lr_scheduler", owner,
                             "a torch LR scheduler built over the given optimizer", scheduler)
    if isinstance(scheduler, SchedulerSequence):
        for member in scheduler.schedulers:
            check_lr_scheduler(owner, member, member.optimizer)
        return scheduler
    if not scheduler_needs_metric(scheduler):
        return scheduler
    required = required_step_arguments(scheduler)
    if len(required) > 1:
        raise InvalidArgumentError(
            f"The 'lr_scheduler' argument of {owner}: {type(scheduler).__name__}.step needs "
            f"{len(required)} arguments ({', '.join(required)}); sparkdl steps a scheduler "
            "with no argument, or with one metric (the validation loss, else the mean "
            "training loss).")
    if getattr(scheduler, "mode", "min") != "min":
        raise InvalidArgumentError(
            f"The 'lr_scheduler' argument of {owner}: {type(scheduler).__name__} has "
            f"mode={scheduler.mode!r}, but sparkdl steps it with a loss (the validation loss "
            "when validation runs, else the mean training loss), which improves downwards: "
            "use mode='min'.")
    return scheduler
