"""What one task computes on its cached partition (executor side).

``local_gradient`` draws the partition's share of the global batch, runs forward and backward on
the worker's replica (optionally in micro-batches) and returns the flat vector
``[ (|B_i| / |B|) * grad of the mean loss on B_i , (|B_i| / |B|) * buffers ]``, so that the sum of
these vectors over all partitions is exactly the gradient on the union batch ``B`` followed by the
sample-weighted average of the replicas' buffers. ``local_evaluation`` computes validation metric
sums on a partition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .batching import task_seed
from .metrics import ValidationMetric
from .process_memory import current_rss_bytes
from .replica import Replica, set_task_threads
from .shards import Shard, open_shard

__all__ = ["StepSpec", "TaskReport", "local_gradient", "local_evaluation"]


@dataclass(frozen=True)
class StepSpec:
    """One iteration's instructions to every task (small; shipped in the job's closure)."""

    run_key: str
    data_key: str
    seed: int
    shuffle: bool
    iteration: int
    epoch: int
    starts: np.ndarray
    counts: np.ndarray
    batch_size: int
    micro_batch_size: int | None


@dataclass
class TaskReport:
    """What a task tells the driver besides its gradient."""

    partition: int
    count: int = 0
    loss: float = 0.0          # this task's part of the batch loss, already weighted
    compute_s: float = 0.0
    missing_shard: bool = False
    attempt: int = 0
    rss_bytes: int = 0         # the Python worker's resident memory after the task
    started_at: float = 0.0    # wall clock (time.time()) when the task's function began
    finished_at: float = 0.0   # ... and when its vector was ready


def _to_tensors(features: Sequence[np.ndarray], labels: np.ndarray
                ) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [torch.from_numpy(f) for f in features], torch.from_numpy(labels)


def _chunks(indices: np.ndarray, size: int | None) -> list[np.ndarray]:
    if not size or size >= len(indices):
        return [indices]
    return [indices[k:k + size] for k in range(0, len(indices), size)]


def local_gradient(spec: StepSpec, partition: int, replica_getter: Any, weights: np.ndarray
                   ) -> tuple[np.ndarray | None, TaskReport]:
    """The weighted local gradient (and buffers) of ``partition``; None when there is none."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    report = TaskReport(partition=partition, attempt=ctx.attemptNumber() if ctx else 0,
                        started_at=time.time())
    count = int(spec.counts[partition])
    report.count = count
    if count == 0:
        return None, report
    shard = open_shard(spec.data_key, partition)
    if shard is None:
        report.missing_shard = True
        return None, report
    t0 = time.perf_counter()
    set_task_threads()
    replica: Replica = replica_getter()
    model, layout = replica.model, replica.layout
    layout.load_weights(model, weights)
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(task_seed(spec.seed, spec.iteration, partition))
    start = int(spec.starts[partition])
    indices = shard.permutation(spec.seed, spec.epoch, partition, spec.shuffle)[start:start + count]
    mean = replica.reduction == "mean"
    loss_sum = 0.0
    for chunk in _chunks(indices, spec.micro_batch_size):
        inputs, target = _to_tensors(*shard.take(chunk))
        loss = replica.criterion(model(*inputs), target)
        weight = len(chunk) / spec.batch_size if mean else 1.0
        (loss * weight).backward()
        loss_sum += float(loss.detach()) * weight
    vector = np.empty(layout.size, dtype=layout.numpy_dtype)
    layout.write_grads(model, vector)
    layout.write_buffers(model, vector, count / spec.batch_size)
    report.loss = loss_sum
    report.compute_s = time.perf_counter() - t0
    report.rss_bytes = current_rss_bytes()
    report.finished_at = time.time()
    return vector, report


def local_evaluation(data_key: str, partition: int, replica: Replica, weights: np.ndarray,
                     metrics: Sequence[ValidationMetric], batch_size: int
                     ) -> tuple[list[np.ndarray] | None, int]:
    """Metric sums over all of ``partition``'s validation samples (None if its shard is gone)."""
    shard: Shard | None = open_shard(data_key, partition)
    if shard is None:
        return None, 0
    set_task_threads()
    model = replica.model
    replica.layout.load_weights(model, weights)
    model.eval()
    sums: list[np.ndarray] = [np.zeros(0)] * len(metrics)
    with torch.no_grad():
        for lo in range(0, shard.count, batch_size):
            idx = np.arange(lo, min(lo + batch_size, shard.count))
            inputs, target = _to_tensors(*shard.take(idx))
            output = model(*inputs)
            for m, metric in enumerate(metrics):
                part = metric.partial(output, target, replica.criterion)
                sums[m] = part if sums[m].size == 0 else sums[m] + part
    return sums, shard.count
