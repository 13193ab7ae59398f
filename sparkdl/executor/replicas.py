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

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..transport.flat_layout import ParamLayout
from .worker_cache import WorkerCache

__all__ = ["Replica", "ReplicaSpec", "get_replica", "drop_replica"]

_REPLICAS: WorkerCache["Replica"] = WorkerCache(capacity=4, freeze=True)


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


def get_replica(run_key: str, spec_source: Any) -> Replica:
    """This worker's replica for a run, built from ``spec_source.value`` (a broadcast of the
    :class:`ReplicaSpec`) on first use."""
    return _REPLICAS.get_or_create(run_key, lambda: Replica(spec_source.value))


def drop_replica(run_key: str) -> None:
    """Forget a run's replica in this worker."""
    _REPLICAS.pop(run_key)
