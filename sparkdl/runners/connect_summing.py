"""How a Spark Connect job's vectors are summed (driver side of
:mod:`sparkdl.runners.connect_dataframe`).

An iteration's vectors are summed by the client (the driver path: every task's whole vector
returned in partition order) or in blocks by a shuffle (``repartitionById``: each reducer adds
its block over the partitions in order). After missing partitions are filled, the client
completes the sum in partition order, bitwise what the undisturbed job gives
(:func:`complete`).

Example::

    s = Summing.of(layout.size, layout.numpy_dtype, options, partitions, codec)
    result = driver_job(data, task, s) if s.driver else shuffle_job(data, task, s)
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..executor.arrow_tasks import (MAP_SCHEMA, REDUCE_SCHEMA, ArrowGradientMap, ArrowReduce,
                                    join_chunks, read_rows)
from ..transport.allreduce import (AllReduceResult, DriverAllReduce, block_bounds,
                                  choose_allreduce, reported_absent, sum_in_order)
from .interface import RunnerOptions

__all__ = ["Summing", "map_job", "driver_job", "shuffle_job", "shuffle_result",
           "finish_blocks", "complete"]


@dataclass
class Summing:
    """How an iteration's vectors of ``size`` values are summed: by the client (``driver``) or
    in the blocks of ``bounds`` by ``repartitionById``, each travelling through ``codec``."""

    size: int
    dtype: np.dtype
    driver: bool
    bounds: np.ndarray
    codec: Any
    client: DriverAllReduce

    @classmethod
    def of(cls, size: int, dtype: np.dtype, options: RunnerOptions, num_partitions: int,
           codec: Any) -> "Summing":
        path = options.allreduce
        if path == "auto":
            path = choose_allreduce(size * np.dtype(dtype).itemsize, num_partitions)
        driver = path == "driver"
        blocks = 1 if driver else (options.num_blocks or num_partitions)
        return cls(size, np.dtype(dtype), driver, block_bounds(size, blocks), codec,
                   DriverAllReduce(size, dtype, codec))


def map_job(data: Any, task: Any, bounds: np.ndarray, codec: Any) -> Any:
    """The map side of a job: every partition's vector, in ``bounds``' blocks."""
    return data.index.mapInArrow(ArrowGradientMap(task, bounds, codec), MAP_SCHEMA)

def driver_job(data: Any, task: Any, s: Summing) -> AllReduceResult:
    submitted_at = time.time()
    table = map_job(data, task, block_bounds(s.size, 1), s.codec).toArrow()   # whole
    returned_at, t0 = time.time(), time.perf_counter()
    pieces: dict[int, list[tuple[int, Any]]] = {}
    reports = []
    for row in read_rows(table):
        pieces.setdefault(int(row["partition"]), []).append((row["seq"], row["payload"]))
        if row["report"] is not None:
            reports.append(pickle.loads(row["report"]))
    parts = [(p, join_chunks(c)) for p, c in pieces.items()]
    vector = sum_in_order(parts, s.codec, 0, s.size, reported_absent(reports))
    return (AllReduceResult(vector, reduce_s=time.perf_counter() - t0,
                            reports=sorted(reports, key=lambda r: r.partition),
                            submitted_at=submitted_at, returned_at=returned_at,
                            pending=parts))

def shuffle_job(data: Any, task: Any, s: Summing) -> AllReduceResult:
    blocks = len(s.bounds) - 1
    submitted_at = time.time()
    reduced = map_job(data, task, s.bounds, s.codec).repartitionById(
        blocks, "k").mapInArrow(ArrowReduce(s.bounds, s.codec), REDUCE_SCHEMA)
    return shuffle_result(reduced.toArrow(), submitted_at, s)

def shuffle_result(table: Any, submitted_at: float, s: Summing
                    ) -> AllReduceResult:
    """The reducers' rows (REDUCE_SCHEMA) as the iteration's result."""
    result = AllReduceResult(np.empty(s.size, dtype=s.dtype),
                             submitted_at=submitted_at, returned_at=time.time())
    pieces: dict[int, list[tuple[int, Any]]] = {}
    later: dict[int, dict[int, list[tuple[int, Any]]]] = {}
    for row in read_rows(table):
        if row["part"] >= 0:     # a block after a missing partition: summed on the client
            later.setdefault(int(row["k"]), {}).setdefault(int(row["part"]), []).append(
                (row["seq"], row["payload"]))
            continue
        pieces.setdefault(int(row["k"]), []).append((row["seq"], row["payload"]))
        if row["info"] is not None:
            reports, seconds, started, finished = pickle.loads(row["info"])
            result.reports.extend(reports)
            result.reduce_s = max(result.reduce_s, seconds)
            result.reduce_started_at = max(result.reduce_started_at, started)
            result.reduce_finished_at = max(result.reduce_finished_at, finished)
    result.reports.sort(key=lambda r: r.partition)
    if result.missing_partitions:     # every block's sum stopped before the first one
        result.pending_blocks = {
            k: (join_chunks(c), [(p, join_chunks(parts)) for p, parts in
                                 sorted(later.get(k, {}).items())])
            for k, c in pieces.items()}
        return result
    for k, c in pieces.items():
        payload = join_chunks(c)
        if payload is None:
            result.vector = None
        elif result.vector is not None:
            lo, hi = int(s.bounds[k]), int(s.bounds[k + 1])
            result.vector[lo:hi] = np.frombuffer(payload, dtype=s.dtype)
    return result

def finish_blocks(result: AllReduceResult, filled: dict[int, Any], s: Summing
                   ) -> AllReduceResult:
    """The shuffle path's blocks completed on the client: each reducer's sum of the
    partitions before the first missing one, then, in partition order, the filled
    partitions' blocks (encoded and decoded as the map side would have) and the later
    partitions' blocks the reducer sent: bitwise the sum of an undisturbed shuffle."""
    assert result.pending_blocks is not None
    t0 = time.perf_counter()
    vector: np.ndarray | None = np.empty(s.size, dtype=s.dtype)
    reports = {r.partition: r for r in result.reports}
    reports.update({p: report for p, (_, report) in filled.items()})
    absent = reported_absent(reports.values())    # the filled tasks' own, not the missed
    for k, (prefix, later) in result.pending_blocks.items():
        lo, hi = int(s.bounds[k]), int(s.bounds[k + 1])
        parts = dict(later)
        for p, (filled_vector, _) in filled.items():
            parts[p] = (None if filled_vector is None else
                        s.codec.encode(filled_vector[lo:hi], lo))
        if absent:      # a pass: the reducer sent every partition's block (ArrowReduce)
            assert prefix is None
            total = sum_in_order(list(parts.items()), s.codec, lo, hi - lo, absent)
            if total is None:
                vector = None
            elif vector is not None:
                vector[lo:hi] = total
            continue
        # the reducer's running sum, continued in partition order (as sum_in_order adds)
        acc = None if prefix is None else np.frombuffer(prefix, s.dtype).copy()
        for _, payload in sorted(parts.items()):
            if payload is None:
                continue
            block = s.codec.decode(payload, lo, hi - lo)
            if acc is None:
                acc = block.copy()
            else:
                acc += block
        if acc is None:
            vector = None
        elif vector is not None:
            vector[lo:hi] = acc
    done = AllReduceResult(vector, reduce_s=result.reduce_s + time.perf_counter() - t0,
                           reports=sorted(reports.values(), key=lambda r: r.partition),
                           submitted_at=result.submitted_at,
                           reduce_started_at=result.reduce_started_at,
                           reduce_finished_at=result.reduce_finished_at,
                           returned_at=result.returned_at)
    assert not done.missing_partitions, "every missing partition is filled first"
    return done


def complete(result: AllReduceResult, filled: dict[int, Any], s: Summing
              ) -> AllReduceResult:
    """An iteration with filled partitions, finished on the client in partition order,
    bitwise what the undisturbed job gives, with nothing large in a job's function and no
    other task computed again: the driver path sums the partitions' encoded vectors with
    the filled ones in place of the missing; the shuffle path continues each reducer's
    running sum (:func:`finish_blocks`)."""
    if result.pending_blocks is not None:
        return finish_blocks(result, filled, s)
    missing = {p: filled[p] for p in result.missing_partitions if p in filled}
    return s.client.complete(result, missing) if missing else result
