"""A ``lightning.LightningModule`` trained with its own ``training_step`` and
``configure_optimizers``, used as they are.

:func:`lightning_step` calls ``module.training_step(batch, batch_idx)`` with the batch
``(*inputs, target)`` (for one input, the usual ``x, y = batch``) and reads the loss it returns
(a tensor, or a dict with ``"loss"``), which must be a mean over the batch's rows.
:func:`lightning_arguments` also unpacks ``configure_optimizers()`` into the engine's
``optimizer``, ``lr_scheduler`` and ``lr_scheduler_step``.

What sparkdl does not take from Lightning (no ``Trainer`` is involved): ``self.log`` is a no-op
(its warning is silenced; sparkdl's summary, TensorBoard and MLflow logging record the loss),
``self.trainer`` is not attached, ``batch_idx`` is always 0, hooks (``on_train_epoch_end`` ...),
``validation_step`` / ``test_step`` (use sparkdl's validation metrics), manual optimisation,
several optimizers, scheduler ``frequency`` other than 1, and the Trainer's own settings
(gradient accumulation, precision, clipping: use the engine's arguments). ``training_step`` must
not return None (skipping a batch).

Example::

    module = MyLightningModule()
    trained = DistriOptimizer(module, rdd, batch_size=64, end_trigger=MaxEpoch(3),
                              **lightning_arguments(module)).optimize()
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Sequence

import torch

from ..errors import InvalidArgumentError, TrainingStepError

__all__ = ["LightningStep", "lightning_step", "lightning_arguments"]

_INTERVALS = {"epoch": "epoch", "step": "iteration"}

log = logging.getLogger("sparkdl")


def _check_module(module: Any) -> None:
    if not isinstance(module, torch.nn.Module) or not callable(
            getattr(module, "training_step", None)):
        raise InvalidArgumentError(
            "lightning_step needs a lightning.LightningModule (an nn.Module with training_step "
            f"and configure_optimizers); got {type(module).__name__}.")


class LightningStep:
    """The training step ``module.training_step((*inputs, target), 0)`` (see the module
    docstring). Picklable: it ships to the executors with the run."""

    def __call__(self, model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                 target: torch.Tensor) -> Any:
        with warnings.catch_warnings():     # self.log without a Trainer: nothing to log to
            warnings.filterwarnings("ignore", message=".*self.log.*")
            result = model.training_step((*inputs, target), 0)   # type: ignore[operator]
        if isinstance(result, dict):
            if "loss" not in result:
                raise TrainingStepError("The LightningModule's training_step returned a dict "
                                        f"without 'loss' (keys {sorted(result)}).")
            result = result["loss"]
        if result is None:
            raise TrainingStepError(
                "The LightningModule's training_step returned None (skip this batch), which "
                "sparkdl does not support: every task's rows are part of the global batch.")
        return result

    def __repr__(self) -> str:
        return "lightning_step()"


def lightning_step(module: Any) -> LightningStep:
    """A training step running ``module``'s own ``training_step``.

    Example: ``DistriOptimizer(module, rdd, optimizer=opt, batch_size=64,
    training_step=lightning_step(module))``.
    """
    _check_module(module)
    return LightningStep()


def _scheduler(config: Any) -> tuple[Any, str]:
    """A scheduler and its interval from Lightning's scheduler configuration."""
    if not isinstance(config, dict):
        return config, "epoch"
    if config.get("monitor") is not None:
        log.warning("configure_optimizers asks the scheduler to monitor %r; sparkdl serves a "
                    "metric-driven scheduler the validation Loss when validation runs, else the "
                    "epoch's mean training loss", config["monitor"])
    if config.get("frequency", 1) != 1:
        raise InvalidArgumentError(
            f"configure_optimizers returned a scheduler with frequency={config['frequency']}; "
            "sparkdl steps schedulers every epoch or every iteration (frequency 1).")
    interval = config.get("interval", "epoch")
    if interval not in _INTERVALS:
        raise InvalidArgumentError(f"configure_optimizers returned a scheduler with "
                                   f"interval={interval!r}; expected 'epoch' or 'step'.")
    return config["scheduler"], _INTERVALS[interval]


def _unpack(config: Any) -> tuple[Any, list[Any]]:
    """(optimizer, [scheduler config]) from each form ``configure_optimizers`` may return."""
    if isinstance(config, torch.optim.Optimizer):
        return config, []
    if isinstance(config, dict):
        scheduler = config.get("lr_scheduler")
        return config.get("optimizer"), [] if scheduler is None else [scheduler]
    if isinstance(config, (list, tuple)):
        if len(config) == 2 and all(isinstance(c, (list, tuple)) for c in config):
            optimizers, schedulers = config
        else:
            optimizers, schedulers = config, []
        if len(optimizers) == 1:
            found, more = _unpack(optimizers[0])
            return found, more + list(schedulers)
        raise InvalidArgumentError(
            f"configure_optimizers returned {len(optimizers)} optimizers; sparkdl trains "
            "with one optimizer.")
    raise InvalidArgumentError(f"configure_optimizers returned {type(config).__name__}; "
                               "expected an optimizer, a list, or a dict with 'optimizer'.")


def lightning_arguments(module: Any) -> dict[str, Any]:
    """The engine arguments that run ``module`` as Lightning would: ``training_step``,
    ``optimizer``, ``lr_scheduler`` and ``lr_scheduler_step`` from ``configure_optimizers()``
    (called once, here).

    Example::

        DistriOptimizer(module, rdd, batch_size=64, **lightning_arguments(module))
    """
    _check_module(module)
    try:
        config = module.configure_optimizers()
    except RuntimeError as exc:      # e.g. it reads self.trainer, which is not attached
        raise InvalidArgumentError(
            f"configure_optimizers of {type(module).__name__} failed without a Trainer "
            f"({exc}); sparkdl attaches none: build the optimizer there from the module's "
            "own attributes, or pass optimizer= and lr_scheduler= yourself.") from exc
    optimizer, schedulers = _unpack(config)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError("configure_optimizers returned no torch optimizer "
                                   f"(got {type(optimizer).__name__}).")
    if len(schedulers) > 1:
        raise InvalidArgumentError(f"configure_optimizers returned {len(schedulers)} "
                                   "schedulers; sparkdl steps one.")
    arguments: dict[str, Any] = {"training_step": LightningStep(), "optimizer": optimizer}
    if schedulers:
        arguments["lr_scheduler"], arguments["lr_scheduler_step"] = _scheduler(schedulers[0])
    return arguments
