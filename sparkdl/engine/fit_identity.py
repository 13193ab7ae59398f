"""What makes two fits the same fit, for checkpoints (driver side).

A checkpoint may only be resumed by the fit that wrote it: the same data (the shards' content
hashes), the same optimizer and scheduler hyperparameters, the same initial weights, on top of
the settings that fix the arithmetic (:meth:`sparkdl.engine.run_context.RunSettings.
reproducibility_key`). The end trigger is not part of it: "train longer" resumes.

Everything here is taken when :meth:`sparkdl.DistriOptimizer.optimize` starts, before any
checkpoint is restored and before any step, so a resumed run compares the objects as the user
built them again with those the interrupted run was given.

Example::

    identity = fit_identity(model, optimizer, scheduler)     # at the start of optimize()
    identity["data"] = data_digest(train.summaries)          # once the shards are built
    subdirectory = identity_directory(identity)               # "fit-3f2a...": one per fit
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch
from torch import nn

from .optimizer_sequence import OptimizerSequence, optimizer_members

__all__ = ["fit_identity", "data_digest", "identity_directory", "FIT_KEYS"]

FIT_KEYS = ("data", "optimizer", "lr_scheduler", "initial_weights", "loss")
"""The keys a checkpoint written before they existed lacks (it is resumed with a warning)."""


def _plain(value: Any) -> Any:
    """A JSON-able, deterministic rendering of a hyperparameter."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value) if not callable(value) else getattr(value, "__qualname__", "callable")


def _optimizer_settings(optimizer: Any) -> dict[str, Any]:
    groups = [{k: _plain(v) for k, v in group.items() if k != "params"}
              | {"params": len(group["params"])} for group in optimizer.param_groups]
    members = optimizer_members(optimizer)
    return {"class": ([type(o).__qualname__ for o in members]
                      if isinstance(optimizer, OptimizerSequence)
                      else type(optimizer).__qualname__), "groups": groups}


def _scheduler_settings(scheduler: Any) -> dict[str, Any] | None:
    if scheduler is None:
        return None
    state = {k: v for k, v in scheduler.state_dict().items() if k != "optimizer"}
    return {"class": type(scheduler).__qualname__, "state": _plain(state)}


def _weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        digest.update(name.encode())
        digest.update(str(value.dtype).encode())
        digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
                      .tobytes() if value.numel() else b"")
    return digest.hexdigest()


def _loss_settings(criterion: Any, training_step: Any) -> dict[str, Any]:
    """What computes the loss: the criterion's class and settings, the training step's name."""
    settings: dict[str, Any] = {}
    if criterion is not None:
        settings["criterion"] = type(criterion).__qualname__
        for name in ("reduction", "ignore_index", "label_smoothing", "weight", "pos_weight"):
            value = getattr(criterion, name, None)
            if value is not None:
                settings[name] = _plain(value.tolist() if isinstance(value, torch.Tensor)
                                        else value)
    if training_step is not None:
        settings["training_step"] = getattr(training_step, "__qualname__",
                                            repr(training_step))
    return settings


def fit_identity(model: nn.Module, optimizer: Any, scheduler: Any, criterion: Any = None,
                 training_step: Any = None) -> dict[str, Any]:
    """The optimizer's and scheduler's hyperparameters, the initial weights' hash and what
    computes the loss (the criterion's class and settings, the training step's name), taken
    before any checkpoint is restored and before any step."""
    return {"optimizer": _optimizer_settings(optimizer),
            "lr_scheduler": _scheduler_settings(scheduler),
            "initial_weights": _weights_digest(model),
            "loss": _loss_settings(criterion, training_step)}


def data_digest(summaries: Sequence[Any]) -> str:
    """One hash of every partition's sample count and content hash, in partition order."""
    digest = hashlib.sha256()
    for s in sorted(summaries, key=lambda s: s.partition):
        digest.update(f"{s.partition}:{s.count}:{s.content_hash};".encode())
    return digest.hexdigest()


def identity_directory(key: dict[str, Any]) -> str:
    """The subdirectory of a checkpoint directory that belongs to the fit with ``key`` (the
    whole resume key): ``fit-<16 hex digits>``."""
    return "fit-" + hashlib.sha256(repr(_plain(key)).encode()).hexdigest()[:16]
