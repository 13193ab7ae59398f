"""The checks of :class:`sparkdl.DistriOptimizer`'s arguments and setters, before any cluster
work (driver side): each builds or fills a :class:`~sparkdl.engine.fit.spec.Fit`, or raises an
:class:`~sparkdl.errors.InvalidArgumentError` naming the argument, what it must be and what it
got.

Example::

    fit = fit_from_arguments(net, rdd, loss, opt, batch_size=64)
    fit.validation = validation_setup(fit, val_rdd, EveryEpoch(), [Loss()], 1024)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from torch import nn

from ...adapters.pretrained import PretrainedModel, trainable_parameters
from ...argument_checks import (argument_error, check_choice, check_int, check_positive_int,
                                 check_type)
from ...errors import CheckpointError, InvalidArgumentError
from ...executor.devices import DEVICES
from ...metrics import ValidationMetric
from ...runners.interface import RunnerOptions
from ...transport.codecs import COMPRESSIONS
from ...triggers import MaxEpoch, Trigger
from .optim.clipping import GradientClipping, check_norm_clipping, check_value_clipping
from .optim.loss_scaling import PRECISIONS
from .optim.outer_optimizer import check_outer
from .optim.optimizer_sequence import as_optimizer, as_scheduler, needs_closure
from .reports.mlflow_tracking import MlflowSetup, check_mlflow
from .reports.progress import check_tensorboard
from .resume.checkpointing import CheckpointSetup
from .run_context import RunSettings
from .spec import OWNER, Fit
from .validation import Validation
from .checks.arguments import (check_criterion, check_lr_scheduler, check_optimizer, check_steps,
                        check_training_data)

__all__ = ["fit_from_arguments", "pretrained_arguments", "validation_setup", "checkpoint_setup", "clipping_setup",
           "fit_name", "tensorboard_setup", "mlflow_setup"]


def fit_from_arguments(model: nn.Module, training_rdd: Any, criterion: Any = None,
                       optimizer: Any = None, batch_size: int | None = None,
                       end_trigger: Trigger | None = None, seed: int = 0,
                       lr_scheduler: Any = None, lr_scheduler_step: str = "epoch",
                       micro_batch_size: int | None = None, shuffle: bool = True,
                       allreduce: str = "auto", num_blocks: int | None = None,
                       progress_bar: bool | None = None, compression: str | None = None,
                       device: str = "auto", precision: str = "32",
                       train_transform: Callable[[Any, Any], Any] | None = None,
                       sequence_inputs: Sequence[int] = (), padding_value: float = 0.0,
                       collate: Any = None, sample_weights: bool = False,
                       exchange_dir: str | None = None, training_step: Any = None,
                       validation_step: Any = None, sub_replicas: int | None = None,
                       local_steps: int = 1, outer_optimizer: Any = None,
                       sync_warmup: int = 0) -> Fit:
    """A :class:`Fit` of :class:`sparkdl.DistriOptimizer`'s arguments, each checked (its
    docstring says what each must be)."""
    model, optimizer, lr_scheduler = pretrained_arguments(model, optimizer, lr_scheduler, seed)
    model = check_type("model", OWNER, model, nn.Module, "a torch.nn.Module")
    training_step, validation_step = check_steps(
        OWNER, criterion, training_step, validation_step, sample_weights)
    if optimizer is None:
        raise argument_error("optimizer", OWNER, "a torch.optim.Optimizer built over "
                             "model.parameters()", optimizer)
    if batch_size is None:
        raise argument_error("batch_size", OWNER, "a positive int", batch_size)
    if train_transform is not None and not callable(train_transform):
        raise argument_error("train_transform", OWNER,
                             "a function (features, numpy Generator) -> features",
                             train_transform)
    inputs = tuple(check_int("sequence_inputs", OWNER, k) for k in sequence_inputs)
    if any(k < 0 for k in inputs):
        raise argument_error("sequence_inputs", OWNER, "input positions >= 0",
                             list(sequence_inputs))
    if isinstance(padding_value, bool) or not isinstance(padding_value, (int, float)):
        raise argument_error("padding_value", OWNER, "a number", padding_value)
    padding_value = float(padding_value)
    if collate is not None and not callable(collate):
        raise argument_error("collate", OWNER, "a function (list of inputs) -> model "
                             "arguments", collate)
    check_type("sample_weights", OWNER, sample_weights, bool, "a bool")
    if exchange_dir is not None and (not isinstance(exchange_dir, str)
                                     or not exchange_dir.strip()):
        raise argument_error("exchange_dir", OWNER, "a directory path or URI, or None",
                             exchange_dir)
    sub_replicas = check_positive_int("sub_replicas", OWNER, sub_replicas, allow_none=True)
    if sample_weights and getattr(criterion, "weight", None) is not None:
        raise InvalidArgumentError(
            "sample_weights=True cannot be combined with a criterion that has class "
            f"weights ({type(criterion).__name__}(weight=...)): fold the class weights into "
            "the sample weights instead.")
    if sample_weights and not (isinstance(criterion, nn.Module) and
                               getattr(criterion, "reduction", None) == "mean"):
        raise InvalidArgumentError(
            f"sample_weights=True needs a torch loss module with reduction='mean' (its "
            f"per-sample values are weighted); got {type(criterion).__name__}"
            + (f" with reduction={criterion.reduction!r}"
               if hasattr(criterion, "reduction") else "") + ".")
    devices = sorted({str(t.device) for t in list(model.parameters()) + list(model.buffers())
                      if not (t.is_meta and not t.requires_grad)})   # a base off the driver
    if devices and devices != ["cpu"]:
        raise InvalidArgumentError(
            f"The 'model' argument of {OWNER} must be on the CPU (it is on {devices}): the "
            "optimizer runs on the driver's CPU and every task moves its own replica to its "
            "device (device='auto' or 'cuda'). Pass the model before .cuda() / .to(...).")
    training_rdd = check_training_data("training_rdd", OWNER, training_rdd)
    reduction = check_criterion(OWNER, criterion) if criterion is not None else "mean"
    optimizer = as_optimizer(optimizer)
    optimizer = check_optimizer(OWNER, optimizer, model)
    end_trigger = check_type("end_trigger", OWNER,
                             end_trigger if end_trigger is not None else MaxEpoch(1),
                             Trigger, "a sparkdl.triggers.Trigger such as MaxEpoch(5)")
    lr_scheduler = check_lr_scheduler(OWNER, as_scheduler(lr_scheduler, optimizer), optimizer)
    if progress_bar is not None and not isinstance(progress_bar, bool):
        raise argument_error("progress_bar", OWNER, "True, False or None (automatic)",
                             progress_bar)
    settings = RunSettings(
        batch_size=check_positive_int("batch_size", OWNER, batch_size),
        seed=check_int("seed", OWNER, seed),
        shuffle=check_type("shuffle", OWNER, shuffle, bool, "a bool"),
        micro_batch_size=check_positive_int("micro_batch_size", OWNER, micro_batch_size,
                                            allow_none=True),
        lr_scheduler_step=check_choice("lr_scheduler_step", OWNER, lr_scheduler_step,
                                       ("epoch", "iteration")),
        runner_options=RunnerOptions(
            allreduce=check_choice("allreduce", OWNER, allreduce,
                                   ("auto", "shuffle", "driver")),
            num_blocks=check_positive_int("num_blocks", OWNER, num_blocks, allow_none=True),
            compression=check_choice("compression", OWNER, compression, COMPRESSIONS),
            device=check_choice("device", OWNER, device, DEVICES),
            precision=check_choice("precision", OWNER, precision, PRECISIONS)),
        progress_bar=progress_bar, sample_weights=sample_weights)
    if precision == "16-mixed" and needs_closure(optimizer):
        raise InvalidArgumentError(
            f"precision='16-mixed' cannot be used with {type(optimizer).__name__}, whose "
            "step needs a closure (torch's GradScaler does not support closures either); use "
            "precision='bf16-mixed' or '32'.")
    fit = Fit(model, training_rdd, criterion, reduction, optimizer, end_trigger, lr_scheduler,
              settings, train_transform, inputs, padding_value, collate, exchange_dir,
              sub_replicas, training_step, validation_step)
    fit.local_steps = check_positive_int("local_steps", OWNER, local_steps)
    fit.outer_optimizer = check_outer(OWNER, outer_optimizer)
    fit.sync_warmup = check_int("sync_warmup", OWNER, sync_warmup)
    if fit.sync_warmup < 0:
        raise argument_error("sync_warmup", OWNER, "an int >= 0 (synchronous iterations before "
                             "the local rounds)", sync_warmup)
    if fit.sync_warmup and fit.local_steps == 1 and fit.outer_optimizer is None:
        raise InvalidArgumentError(
            f"{OWNER}: sync_warmup={fit.sync_warmup} has no effect with local_steps=1 and no "
            "outer_optimizer (synchronous SGD throughout); set local_steps > 1 for post-local "
            "SGD, or leave sync_warmup at 0.")
    return fit


def pretrained_arguments(model: Any, optimizer: Any, lr_scheduler: Any, seed: Any
                         ) -> tuple[Any, Any, Any]:
    """A :class:`~sparkdl.adapters.PretrainedModel` built as the driver holds it (with
    ``seed``), its ``optimizer`` callable called on the trainable parameters, and an
    ``lr_scheduler`` callable on that optimizer; other arguments as they are."""
    if not isinstance(model, PretrainedModel):
        return model, optimizer, lr_scheduler
    model = model.driver_model(check_int("seed", OWNER, seed))
    if callable(optimizer) and not hasattr(optimizer, "step"):
        optimizer = optimizer([p for _, p in trainable_parameters(model)])
    elif optimizer is not None:
        raise argument_error("optimizer", OWNER, "with a PretrainedModel, a callable params -> "
                             "torch.optim.Optimizer (the trainable parameters exist once the "
                             "model is built), e.g. lambda p: torch.optim.AdamW(p, lr=1e-4)",
                             optimizer)
    if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        lr_scheduler = lr_scheduler(optimizer)
    return model, optimizer, lr_scheduler


def validation_setup(rdd: Any, trigger: Trigger, metrics: Any, batch_size: int) -> Validation:
    """``set_validation``'s arguments, checked."""
    owner = f"{OWNER}.set_validation"
    check_training_data("rdd", owner, rdd)
    check_type("trigger", owner, trigger, Trigger, "a sparkdl.triggers.Trigger")
    if isinstance(metrics, ValidationMetric):
        metrics = [metrics]
    if not metrics or not all(isinstance(m, ValidationMetric) for m in metrics):
        raise argument_error("metrics", owner, "a non-empty list of "
                             "sparkdl.metrics.ValidationMetric", metrics)
    return Validation(rdd, trigger, list(metrics),
                      check_positive_int("batch_size", owner, batch_size))


def checkpoint_setup(fit: Fit, path: str, trigger: Trigger, keep_last: int, resume: bool,
                     by_fit: bool) -> CheckpointSetup:
    """``set_checkpoint``'s arguments, checked, and the directory checked for writing."""
    owner = f"{OWNER}.set_checkpoint"
    if not isinstance(path, str) or not path.strip():
        raise argument_error("path", owner, "a non-empty directory path or URI", path)
    check_type("trigger", owner, trigger, Trigger,
               "a sparkdl.triggers.Trigger such as EveryEpoch()")
    keep_last = check_positive_int("keep_last", owner, keep_last)
    check_type("resume", owner, resume, bool, "a bool")
    check_type("by_fit", owner, by_fit, bool, "a bool")
    store = fit.checkpoint_store(path)
    store.check_writable()
    if not resume and store.iterations():
        raise CheckpointError(
            f"The checkpoint directory {path!r} already holds checkpoints "
            f"(iterations {store.iterations()}) and resume=False: choose an empty directory "
            "or pass resume=True to continue from the newest one.")
    return CheckpointSetup(path, trigger, keep_last, resume, by_fit)


def clipping_setup(current: GradientClipping | None, max_norm: float | None = None,
                   norm_type: float = 2.0, value_range: tuple[float, float] | None = None
                   ) -> GradientClipping:
    """The clipping after ``set_gradient_clipping`` (``max_norm``) or
    ``set_constant_gradient_clipping`` (``value_range``), checked."""
    current = current or GradientClipping()
    if value_range is not None:
        low, high = check_value_clipping(f"{OWNER}.set_constant_gradient_clipping",
                                         *value_range)
        return dataclasses.replace(current, min_value=low, max_value=high)
    max_norm, norm_type = check_norm_clipping(f"{OWNER}.set_gradient_clipping", max_norm,
                                              norm_type)
    return dataclasses.replace(current, max_norm=max_norm, norm_type=norm_type)


def fit_name(name: str) -> str:
    """``set_fit_identity``'s name, checked."""
    if not isinstance(name, str) or not name.strip():
        raise argument_error("name", f"{OWNER}.set_fit_identity", "a non-empty string", name)
    return name


def tensorboard_setup(settings: RunSettings, log_dir: str) -> RunSettings:
    """The settings with ``set_tensorboard``'s directory, checked (the package too)."""
    owner = f"{OWNER}.set_tensorboard"
    if not isinstance(log_dir, str) or not log_dir.strip():
        raise argument_error("log_dir", owner, "a non-empty directory path", log_dir)
    check_tensorboard(log_dir)
    return dataclasses.replace(settings, tensorboard_dir=log_dir)


def mlflow_setup(run_id: str | None, parent_run_id: str | None, run_name: str | None,
                 params: Mapping[str, Any] | None, tags: Mapping[str, str] | None,
                 flush_interval_s: float, finish_timeout_s: float) -> MlflowSetup:
    """``set_mlflow``'s arguments, checked (the package too)."""
    owner = f"{OWNER}.set_mlflow"
    for name, value in (("run_id", run_id), ("parent_run_id", parent_run_id),
                        ("run_name", run_name)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise argument_error(name, owner, "a non-empty string or None", value)
    for name, mapping in (("params", params), ("tags", tags)):
        if mapping is not None and (not isinstance(mapping, Mapping) or
                                    not all(isinstance(k, str) for k in mapping)):
            raise argument_error(name, owner, "a dict with string keys or None", mapping)
    for name, seconds in (("flush_interval_s", flush_interval_s),
                          ("finish_timeout_s", finish_timeout_s)):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                not seconds > 0:
            raise argument_error(name, owner, "a positive number of seconds", seconds)
    check_mlflow(owner)
    return MlflowSetup(run_id, parent_run_id, run_name,
                       dict(params) if params is not None else None,
                       {k: str(v) for k, v in (tags or {}).items()},
                       float(flush_interval_s), float(finish_timeout_s))
