"""Model replicas kept in each Python worker between iterations (executor side).

The model's architecture reaches a worker once per training run (a Spark broadcast of the pickled
module and criterion); afterwards only weights travel. The cache lives in this importable module so
that it survives from task to task in a reused Python worker (:mod:`sparkdl.executor.worker_cache`).

Example::

    replica = get_replica(run_key, spec_broadcast)   # built from spec_broadcast.value once
    replica.layout.load_weights(replica.model, weights)
    drop_replica(run_key)
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..losses import divided_on_driver
from ..transport.flat_layout import ParamLayout
from .worker_cache import WorkerCache

__all__ = ["Replica", "ReplicaSpec", "get_replica", "drop_replica", "training_modes",
           "non_persistent_buffers", "load_non_persistent_buffers",
           "set_training_modes"]

_REPLICAS: WorkerCache["Replica"] = WorkerCache(capacity=16, freeze=True)


@dataclass
class ReplicaSpec:
    """What a worker needs to build a replica: shipped once per run in a broadcast."""

    model: nn.Module
    criterion: Any
    reduction: str
    train_transform: Any = None
    padding_value: float = 0.0
    collate: Any = None
    sample_weights: bool = False
    training_step: Any = None       # sparkdl.training_step: replaces criterion(model(*inputs))
    validation_step: Any = None     # replaces model(*inputs) in validation
    input_names: tuple[str, ...] = ()   # the features' columns (estimators), for id errors

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # a pretrained model's driver copy ships as its description and trainable tensors;
        # the executor that unpickles it loads the base itself (sparkdl.adapters.pretrained)
        from ..adapters.pretrained import shipped_model

        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        values[0] = shipped_model(self.model)
        return type(self), tuple(values)


def training_modes(model: nn.Module) -> list[bool]:
    """Each module's train/eval flag, in ``model.modules()`` order.

    A model whose modules are all in eval mode (left so after an evaluation or a ``load``) trains
    in train mode, as a training loop that calls ``model.train()`` would; otherwise the flags are
    kept as the user left them, so a submodule put in eval (a frozen, pre-trained BatchNorm or
    Dropout) stays in eval in every task."""
    modes = [m.training for m in model.modules()]
    return [True] * len(modes) if not any(modes) else modes


def non_persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers that ``state_dict()`` leaves out (``persistent=False``) but that train like the
    others, by name (copies)."""
    saved = model.state_dict()
    return {k: v.detach().clone() for k, v in model.named_buffers() if k not in saved}


def load_non_persistent_buffers(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Copy ``values`` (from :func:`non_persistent_buffers`) into ``model``'s buffers."""
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in values.items():
            buffers[name].copy_(value)


def set_training_modes(model: nn.Module, modes: list[bool]) -> None:
    """Put every module of ``model`` in the mode :func:`training_modes` recorded."""
    for module, mode in zip(model.modules(), modes):
        module.training = mode


class Replica:
    """A worker's private copy of the model and criterion on one device, with the flat layout
    (taken on the CPU, before the move, so it matches the driver's)."""

    def __init__(self, spec: ReplicaSpec, device: str = "cpu") -> None:
        self.layout = ParamLayout(spec.model)
        self.device = torch.device(device)
        self.model = spec.model.to(self.device)
        criterion = spec.criterion
        self.criterion = criterion.to(self.device) if isinstance(criterion, nn.Module) else criterion
        self.reduction = spec.reduction
        self.train_transform = spec.train_transform
        self.padding_value, self.collate = spec.padding_value, spec.collate
        self.sample_weights = spec.sample_weights
        self.training_step, self.validation_step = spec.training_step, spec.validation_step
        self.input_names = tuple(getattr(spec, "input_names", ()) or ())
        self.train_modes = training_modes(spec.model)
        self.per_sample_criterion = None
        self.refresh_state: Any = None    # its copy of the weights (transport.weight_refresh)
        # a mean loss whose normaliser is not the row count (sparkdl.losses): tasks report it
        # (a training step's loss always travels so: a mean over rows counts each row once)
        self.normalised = spec.training_step is not None or divided_on_driver(
            self.criterion, spec.reduction, spec.sample_weights)
        if spec.sample_weights:     # the same loss, one value per sample
            self.per_sample_criterion = copy.copy(self.criterion)
            self.per_sample_criterion.reduction = "none"


def get_replica(run_key: str, spec_source: Any, device: str = "cpu", sub: int = 0) -> Replica:
    """This worker's replica for a run on ``device``, built from ``spec_source.value`` (a
    broadcast of the :class:`ReplicaSpec`) on first use. A reused worker may be given another
    GPU in a later task: it then holds one replica per device. ``sub`` > 0: another copy, a
    sub-replica of a task with several cores (:mod:`sparkdl.executor.sub_replicas`)."""
    key = (run_key, device) if sub == 0 else (run_key, device, sub)
    return _REPLICAS.get_or_create(key, lambda: Replica(spec_source.value, device))


def drop_replica(run_key: str) -> None:
    """Forget a run's replicas (on every device) in this worker."""
    for key in [k for k in _REPLICAS.keys() if k[0] == run_key]:
        _REPLICAS.pop(key)
