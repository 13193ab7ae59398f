"""Summing every task's flat vector: the AllReduce of one iteration.

The SGD loop hands an AllReduce a per-partition function that returns a flat vector (or None) and
a small report; it gets back the element-wise sum over partitions and the reports. It does not know
how the sum is made. Two ways exist:

* :class:`ShuffleAllReduce` (BigDL's design, for large models): every map task cuts its vector into
  ``K`` contiguous blocks and emits ``(k, block_k)``; a shuffle brings block ``k`` of every task to
  reduce partition ``k``, which sums them in partition order; the driver collects the ``K`` sums.
  One Spark job, two stages; each reducer moves ``1/K`` of the data.
* :class:`DriverAllReduce` (for small models): one stage; each task returns its whole vector and
  the driver sums them in partition order.

Both sum in the same order (partition 0, 1, 2, ...), so they give bitwise the same result, and a
retried task or a recomputed partition cannot change it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from pyspark import RDD

from .local_step import TaskReport
from .wire_codec import ExactCodec

__all__ = ["AllReduceResult", "ShuffleAllReduce", "DriverAllReduce", "block_bounds",
           "choose_allreduce", "DRIVER_ALLREDUCE_MAX_BYTES"]

DRIVER_ALLREDUCE_MAX_BYTES = 64 << 20
"""``allreduce="auto"`` sums at the driver while the driver would receive at most this many bytes
per iteration (vector bytes x partitions); above it the shuffle's second stage costs less than
funnelling every whole vector through the driver. Crossover measured with
bench/allreduce_crossover.py (docs/scaling.md)."""


def choose_allreduce(vector_bytes: int, num_partitions: int) -> str:
    """``"driver"`` or ``"shuffle"`` for a vector of ``vector_bytes`` from ``num_partitions``
    tasks: the rule behind ``allreduce="auto"``."""
    return "driver" if vector_bytes * num_partitions <= DRIVER_ALLREDUCE_MAX_BYTES else "shuffle"


LocalFn = Callable[[int, Any], "tuple[np.ndarray | None, TaskReport]"]


@dataclass
class AllReduceResult:
    """The summed vector (None if no partition contributed) and what the tasks reported."""

    vector: np.ndarray | None
    reports: list[TaskReport] = field(default_factory=list)
    reduce_s: float = 0.0

    @property
    def missing_partitions(self) -> list[int]:
        return sorted(r.partition for r in self.reports if r.missing_shard)


def block_bounds(size: int, num_blocks: int) -> np.ndarray:
    """Edges of ``num_blocks`` contiguous, nearly equal blocks of a vector of ``size``."""
    k = max(1, min(int(num_blocks), size))
    return (np.arange(k + 1, dtype=np.int64) * size) // k


def _sum_in_order(parts: Iterable[tuple[int, bytes | None]], codec: Any, lo: int,
                  length: int) -> np.ndarray | None:
    acc: np.ndarray | None = None
    for _, payload in sorted(parts, key=lambda p: p[0]):
        if payload is None:
            continue
        arr = codec.decode(payload, lo, length)
        if acc is None:
            acc = arr.copy()
        else:
            acc += arr
    return acc


def _block_partition(key: int) -> int:
    return key


class ShuffleAllReduce:
    """Block-sharded AllReduce through one shuffle (see the module docstring).

    Args:
        size: length of the vectors.
        dtype: their numpy dtype.
        num_blocks: number of blocks, i.e. of reduce partitions.
        codec: how blocks travel (:mod:`sparkdl.wire_codec`); default exact.
    """

    def __init__(self, size: int, dtype: np.dtype, num_blocks: int, codec: Any = None) -> None:
        self.size = int(size)
        self.dtype = np.dtype(dtype)
        self.bounds = block_bounds(size, num_blocks)
        self.num_blocks = len(self.bounds) - 1
        self.codec = codec if codec is not None else ExactCodec(self.dtype)

    def run(self, index_rdd: RDD, local_fn: LocalFn) -> AllReduceResult:
        bounds, num_blocks, dtype, codec = self.bounds, self.num_blocks, self.dtype, self.codec

        def map_side(partition: int, records: Iterator[Any]) -> Iterator[Any]:
            summaries = list(records)
            vector, report = local_fn(partition, summaries[0] if summaries else None)
            for k in range(num_blocks):
                block = (None if vector is None else
                         codec.encode(vector[bounds[k]:bounds[k + 1]], int(bounds[k])))
                yield k, (partition, block, report if k == 0 else None)

        def reduce_side(_: int, records: Iterator[Any]) -> Iterator[Any]:
            t0 = time.perf_counter()
            by_block: dict[int, list[tuple[int, bytes | None]]] = {}
            reports = []
            for k, (partition, block, report) in records:
                by_block.setdefault(k, []).append((partition, block))
                if report is not None:
                    reports.append(report)
            for k, parts in by_block.items():
                total = _sum_in_order(parts, codec, int(bounds[k]),
                                      int(bounds[k + 1] - bounds[k]))
                yield (k, None if total is None else total.tobytes(), reports,
                       time.perf_counter() - t0)

        shuffled = index_rdd.mapPartitionsWithIndex(map_side).partitionBy(
            num_blocks, _block_partition)
        results = sorted(shuffled.mapPartitionsWithIndex(reduce_side).collect(),
                         key=lambda r: r[0])
        reports = sorted((r for res in results for r in res[2]), key=lambda r: r.partition)
        reduce_s = max((res[3] for res in results), default=0.0)
        if any(res[1] is None for res in results):
            return AllReduceResult(None, reports, reduce_s)
        vector = np.concatenate([np.frombuffer(res[1], dtype=dtype) for res in results])
        return AllReduceResult(vector, reports, reduce_s)


class DriverAllReduce:
    """One-stage AllReduce: tasks return whole vectors, the driver sums them in partition order."""

    def __init__(self, size: int, dtype: np.dtype, codec: Any = None) -> None:
        self.size = int(size)
        self.dtype = np.dtype(dtype)
        self.codec = codec if codec is not None else ExactCodec(self.dtype)

    def run(self, index_rdd: RDD, local_fn: LocalFn) -> AllReduceResult:
        codec = self.codec

        def map_side(partition: int, records: Iterator[Any]) -> Iterator[Any]:
            summaries = list(records)
            vector, report = local_fn(partition, summaries[0] if summaries else None)
            yield partition, None if vector is None else codec.encode(vector, 0), report

        results = index_rdd.mapPartitionsWithIndex(map_side).collect()
        t0 = time.perf_counter()
        vector = _sum_in_order(((p, b) for p, b, _ in results), codec, 0, self.size)
        reports = sorted((r for _, _, r in results), key=lambda r: r.partition)
        return AllReduceResult(vector, reports, time.perf_counter() - t0)
