"""Model replicas kept in each Python worker between iterations (executor side).

The model's architecture reaches a worker once per training run (a Spark broadcast of the pickled
module and criterion); afterwards only weights travel. The cache lives in this importable module so
that it survives from task to task in a reused Python worker.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .flat_params import ParamLayout
from .worker_gc import freeze_long_lived, release_frozen

__all__ = ["Replica", "ReplicaSpec", "get_replica", "drop_replica"]

_MAX_CACHED = 4
_CACHE: "OrderedDict[str, Replica]" = OrderedDict()


@dataclass
class ReplicaSpec:
    """What a worker needs to build a replica: shipped once per run in a broadcast."""

    model: nn.Module
    criterion: Any
    reduction: str


class Replica:
    """A worker's private copy of the model and criterion, with the flat layout."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.model = spec.model
        self.criterion = spec.criterion
        self.reduction = spec.reduction
        self.layout = ParamLayout(self.model)


def get_replica(run_key: str, spec_broadcast: Any) -> Replica:
    """This worker's replica for a run, built from the broadcast on first use."""
    replica = _CACHE.get(run_key)
    if replica is None:
        replica = Replica(spec_broadcast.value)
        _CACHE[run_key] = replica
        while len(_CACHE) > _MAX_CACHED:
            _CACHE.popitem(last=False)
        freeze_long_lived()
    _CACHE.move_to_end(run_key)
    return replica


def drop_replica(run_key: str) -> None:
    """Forget a run's replica in this worker."""
    if _CACHE.pop(run_key, None) is not None:
        release_frozen()


def set_task_threads() -> None:
    """Use as many torch threads as Spark gave the task cores (``spark.task.cpus``)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    cpus = ctx.cpus() if ctx is not None else 1
    if torch.get_num_threads() != cpus:
        torch.set_num_threads(max(1, int(cpus)))
