"""The functions the DataFrame runner (Spark Connect) hands to ``mapInArrow``: what
:mod:`sparkdl.executor.tasks` ships in RDD jobs, with Arrow batches in and out (executor side).

Every function reads its whole input (a Python worker that stops early is not reused) and
yields one-row batches. Large byte strings (gradient blocks, pickled results) travel in chunks
of :data:`CHUNK_BYTES`, numbered by ``seq``, which keeps every row far below gRPC's message
limit on the way to the client. The batches a reducer reads are Spark's (up to
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, 32-bit binary offsets): a reduce
partition must receive less than 2 GiB, i.e. vector bytes x partitions / blocks; raise
``num_blocks`` beyond that.

Schemas:

* build: ``partition, summary`` (one row per partition: the pickled ShardSummary);
* gradient map: ``k, partition, seq, report, payload`` (block ``k`` of the partition's
  encoded vector, ``k`` an int as ``repartitionById`` requires; the pickled TaskReport on the
  first row of block 0);
* reduce: ``k, seq, info, payload`` (block ``k`` summed in partition order);
* evaluation and fill: ``partition, seq, summary, payload`` (a pickled result in chunks).

Example::

    index.mapInArrow(ArrowGradientMap(task, bounds, codec), MAP_SCHEMA)
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from ..transport.allreduce import reported_absent, sum_in_order
from .exchange import Payload, drop_payloads
from .replicas import drop_replica
from .shard_store import drop_run, open_shard
from .tasks import ShardBuildTask

__all__ = ["CHUNK_BYTES", "BUILD_SCHEMA", "MAP_SCHEMA", "REDUCE_SCHEMA", "RESULT_SCHEMA",
           "PayloadValue", "ArrowBuildTask", "ArrowGradientMap", "ArrowReduce",
           "ArrowEvaluate", "ArrowFill", "ArrowCleanup", "chunks", "read_rows"]

CHUNK_BYTES = 4 << 20
BUILD_SCHEMA = "partition long, summary binary"
MAP_SCHEMA = "k int, partition long, seq long, report binary, payload binary"
REDUCE_SCHEMA = "k long, part long, seq long, info binary, payload binary"
RESULT_SCHEMA = "partition long, seq long, summary binary, payload binary"

_PICKLE = pickle.HIGHEST_PROTOCOL


def chunks(buffer: Any) -> list[Any]:
    """``buffer`` (bytes or a contiguous array) cut into views of at most CHUNK_BYTES; [None]
    for None, so that a row still says the partition or block took part."""
    if buffer is None:
        return [None]
    view = memoryview(buffer).cast("B")
    return [view[lo:lo + CHUNK_BYTES] for lo in range(0, max(len(view), 1), CHUNK_BYTES)]


def _row(schema: list[tuple[str, Any]], values: list[Any]) -> pa.RecordBatch:
    arrays = [pa.array([None if v is None else (bytes(v) if isinstance(v, memoryview) else v)],
                       t) for (_, t), v in zip(schema, values)]
    return pa.RecordBatch.from_arrays(arrays, [n for n, _ in schema])


_BUILD = [("partition", pa.int64()), ("summary", pa.binary())]
_MAP = [("k", pa.int32()), ("partition", pa.int64()), ("seq", pa.int64()),
        ("report", pa.binary()), ("payload", pa.binary())]
_REDUCE = [("k", pa.int64()), ("part", pa.int64()), ("seq", pa.int64()), ("info", pa.binary()),
           ("payload", pa.binary())]
_RESULT = [("partition", pa.int64()), ("seq", pa.int64()), ("summary", pa.binary()),
           ("payload", pa.binary())]


def read_rows(batches: Any) -> list[dict[str, Any]]:
    """All rows of Arrow batches (or a Table) as dicts."""
    if isinstance(batches, pa.Table):
        return batches.to_pylist()
    return [row for batch in batches for row in batch.to_pylist()]


def _partition_id() -> int:
    from pyspark import TaskContext

    return int(TaskContext.get().partitionId())


def _result_rows(partition: int, summary: bytes | None, result: bytes
                 ) -> Iterator[pa.RecordBatch]:
    for seq, chunk in enumerate(chunks(result)):
        yield _row(_RESULT, [partition, seq, summary if seq == 0 else None, chunk])


@dataclass(frozen=True)
class PayloadValue:
    """A :class:`~sparkdl.executor.exchange.Payload` read as a task expects a broadcast:
    ``.value`` is the bytes (``kind="bytes"``, e.g. the cloudpickled model that the task
    unpickles itself) or a flat array of ``dtype`` (``"array"``)."""

    payload: Payload
    kind: str = "bytes"
    dtype: str = ""

    @property
    def value(self) -> Any:
        data = self.payload.read()
        return np.frombuffer(data, dtype=self.dtype) if self.kind == "array" else data


@dataclass
class ArrowBuildTask:
    """The build job: this partition's rows into a shard kept where the task runs."""

    converter: Any        # sparkdl.data.dataframe_arrays.BlockConverter
    build: ShardBuildTask

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _partition_id()
        summary = next(self.build(partition, self.converter.blocks(batches)))
        yield _row(_BUILD, [partition, pickle.dumps(summary, _PICKLE)])


@dataclass
class ArrowGradientMap:
    """An iteration's map side over the index rows: ``task`` (a GradientTask) on the
    partition, its vector cut into the blocks of ``bounds`` and encoded by ``codec``."""

    task: Any
    bounds: np.ndarray
    codec: Any

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for row in read_rows(batches):
            partition = int(row["partition"])
            vector, report = self.task(partition, None)
            head = pickle.dumps(report, _PICKLE)
            # every block of a missing partition carries its report (each reducer must know
            # which partitions its sum lacks), and of a pass's task with fits that took no
            # rows here (each reducer skips their zeros: PassReport.absent)
            every = (bool(getattr(report, "missing_shard", False))
                     or bool(getattr(report, "absent", ())))
            # the other blocks' reducers read only that: the tables' rows go with block 0
            other = None if not every else (
                pickle.dumps(dataclasses.replace(report, table_rows=None), _PICKLE)
                if getattr(report, "table_rows", None) else head)
            for k in range(len(self.bounds) - 1):
                lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
                block = None if vector is None else self.codec.encode(vector[lo:hi], lo)
                for seq, chunk in enumerate(chunks(block)):
                    first = head if k == 0 else other
                    yield _row(_MAP, [k, partition, seq, first if seq == 0 else None, chunk])


def join_chunks(parts: list[tuple[int, Any]]) -> bytes | None:
    """The byte string whose ``(seq, chunk)`` pieces these are (None when it was None)."""
    ordered = [c for _, c in sorted(parts, key=lambda p: p[0])]
    if ordered == [None]:
        return None
    return ordered[0] if len(ordered) == 1 else b"".join(ordered)


@dataclass
class ArrowReduce:
    """The reduce side: every block ``k`` that reached this partition, summed in partition
    order (whatever order the rows came in). When a partition's task found no shard, the sum
    stops before it: the block's sum of the partitions before the first missing one (``part``
    -1) and each later partition's block (``part`` = its partition) travel to the client,
    which goes on adding in partition order once the missing vectors are filled
    (:func:`finish_blocks`): bitwise the undisturbed sum, and no other task computes again."""

    bounds: np.ndarray
    codec: Any

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started_at, t0 = time.time(), time.perf_counter()
        pieces: dict[int, dict[int, list[tuple[int, Any]]]] = {}
        reports: dict[int, list[Any]] = {}
        for row in read_rows(batches):
            k, partition = int(row["k"]), int(row["partition"])
            pieces.setdefault(k, {}).setdefault(partition, []).append((row["seq"],
                                                                       row["payload"]))
            if row["report"] is not None:
                reports.setdefault(k, []).append(pickle.loads(row["report"]))
        for k in sorted(pieces):
            lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
            parts = [(p, join_chunks(c)) for p, c in pieces[k].items()]
            missing = [r.partition for r in reports.get(k, []) if r.missing_shard]
            absent = reported_absent(reports.get(k, []))
            first = min(missing, default=None)
            if first is not None and absent:   # a pass: the client sums every partition's
                first = -1                     # block again, skipping the absent ranges
            total = sum_in_order([(p, b) for p, b in parts if first is None or p < first],
                                 self.codec, lo, hi - lo, absent)
            forwarded = reports.get(k, []) if k == 0 else []   # block 0 carries every report
            info = pickle.dumps((forwarded, time.perf_counter() - t0, started_at,
                                 time.time()), _PICKLE)
            for seq, chunk in enumerate(chunks(total)):
                yield _row(_REDUCE, [k, -1, seq, info if seq == 0 else None, chunk])
            for p, payload in sorted(parts):
                if first is not None and p > first and p not in missing:
                    for seq, chunk in enumerate(chunks(payload)):
                        yield _row(_REDUCE, [k, p, seq, None, chunk])


@dataclass
class ArrowEvaluate:
    """A validation job over the index rows: ``task`` (an EvaluationTask) on the shard here."""

    task: Any

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for row in read_rows(batches):
            partition = int(row["partition"])
            result = self.task.compute(partition, open_shard(self.task.data_key, partition))
            yield from _result_rows(partition, None, pickle.dumps(result, _PICKLE))


@dataclass
class ArrowFill:
    """A fill job over the input rows of the ``partitions`` whose task found no shard: builds
    the shard where this task runs and computes ``task.compute`` on it. Other partitions (Spark
    calls the function on them too, with no rows) yield nothing."""

    converter: Any
    build: ShardBuildTask
    task: Any
    partitions: frozenset[int]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _partition_id()
        if partition not in self.partitions:
            for _ in batches:
                pass
            return
        summary = next(self.build(partition, self.converter.blocks(batches)))
        shard = open_shard(self.build.data_key, partition) if summary.error is None else None
        result = self.task.compute(partition, shard)
        yield from _result_rows(partition, pickle.dumps(summary, _PICKLE),
                                pickle.dumps(result, _PICKLE))


@dataclass
class ArrowCleanup:
    """Drops the shards and replicas of ``keys`` in whichever worker runs it."""

    keys: list[str]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        for key in self.keys:
            drop_run(key)
            drop_replica(key)
        drop_payloads()
        return iter(())
