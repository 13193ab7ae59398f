"""Summing every task's flat vector: the AllReduce of one iteration.

The SGD loop hands an AllReduce a per-partition function that returns a flat vector (or None) and
a small report; it gets back the element-wise sum over partitions and the reports. It does not know
how the sum is made. Two ways exist:

* :class:`ShuffleAllReduce` (BigDL's design, for large models): every map task cuts its vector into
  ``K`` contiguous blocks and emits ``(k, block_k)``; a shuffle brings block ``k`` of every task to
  reduce partition ``k``, which sums them in partition order; the driver collects the ``K`` sums.
  One Spark job, two stages; each reducer moves ``1/K`` of the data. A large vector is cut into
  blocks of at most ``record_bytes`` (``spark.sparkdl.maxRecordBytes``, 32 MiB by default),
  every block travels in frames of at most that (one JVM record each), and the sums reach
  the driver in jobs of at most ``job_bytes`` each (the later jobs run only reduce tasks, over
  the map outputs Spark keeps): no object in the driver's JVM grows with the model, and no job's
  results exceed ``spark.driver.maxResultSize`` (:func:`driver_job_bytes`). On a ``local[...]``
  master (every task runs on the driver's machine) the data goes through files instead
  (:attr:`PythonJobs.local_dir`): each map task writes its vector to one file and the shuffle
  carries only its name (an uncompressed vector), each reducer reads its block of every file
  (mapped) and writes its sum to a file the driver's Python reads; one job, and neither the
  vectors nor the sums pass through the JVM. The map files are removed once the iteration's
  result is final (:meth:`ShuffleAllReduce.settle`).
* :class:`DriverAllReduce` (for small models): one stage; each task returns its whole vector and
  the driver sums them in partition order.

Both sum in the same order (partition 0, 1, 2, ...), so they give bitwise the same result, and a
retried task or a recomputed partition cannot change it. Vectors travel as unpickled byte frames
(:mod:`sparkdl.transport.frames`): a small pickled header, then the raw buffer, which leaves numpy
without a copy and reaches the other side as one ``bytes`` object.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from pyspark import RDD

from .codecs import ExactCodec, make_codec
from .flat_layout import ParamLayout
from .pieced_broadcast import PIECE_BYTES
from .segmented_vector import SegmentedVector, write_vector
from .table_rows import Rows, join_rows, split_rows, sum_rows
from .frames import (MAX_FRAME_BYTES, collect_messages, keyed_frame, message_frames,
                     read_messages, shuffle_frames)
from .python_jobs import IterationJobs, JobRdd
from .filled_blocks import FilledReport, union_frames, unwrap_filled
from .stream_reads import read_exactly

__all__ = ["AllReduceResult", "ShuffleAllReduce", "DriverAllReduce", "block_bounds",
           "choose_allreduce", "make_allreduce", "make_pass_allreduce", "sum_in_order",
           "reported_absent", "with_resources", "shuffle_blocks", "driver_job_bytes", "job_intake",
           "blocks_per_job",
           "DRIVER_ALLREDUCE_MAX_BYTES", "DRIVER_HEAP_SHARE", "MAX_SHUFFLE_BLOCKS"]

log = logging.getLogger(__name__)

DRIVER_ALLREDUCE_MAX_BYTES = 64 << 20
"""``allreduce="auto"`` sums at the driver while the driver would receive at most this many bytes
per iteration (vector bytes x partitions), and uses the shuffle above it. Measured with
bench/allreduce_crossover.py on local[2] (bench/RESULTS.md): the one-stage driver path was
faster at every size up to 32 MiB gradients (0.55x the shuffle's iteration at 0.25 MiB, 0.83x at
32 MiB: its advantage, one stage fewer, shrinks as bytes dominate), and at 64 MiB (128 MiB into
the driver) it ran the default 1 GiB driver heap out of memory. The limit keeps the driver's
intake well inside a default heap (docs/scaling.md)."""


def choose_allreduce(vector_bytes: int, num_partitions: int, job_bytes: int | None = None
                     ) -> str:
    """``"driver"`` or ``"shuffle"`` for a vector of ``vector_bytes`` from ``num_partitions``
    tasks: the rule behind ``allreduce="auto"`` (never the driver path above ``job_bytes``,
    what one job may hand the driver: :func:`driver_job_bytes`)."""
    limit = DRIVER_ALLREDUCE_MAX_BYTES if job_bytes is None else min(DRIVER_ALLREDUCE_MAX_BYTES,
                                                                     job_bytes)
    return "driver" if vector_bytes * num_partitions <= limit else "shuffle"


DRIVER_HEAP_SHARE = 8
"""A job hands the driver at most ``heap / DRIVER_HEAP_SHARE`` bytes of task results: 128 MiB of
results per iteration ran a 1 GiB heap out of memory (bench/allreduce_crossover.py)."""

MAX_SHUFFLE_BLOCKS = 200
"""At most this many blocks (reduce partitions) are made to keep a job's share of the sums
(``job_bytes``) small: up to ``spark.shuffle.sort.bypassMergeThreshold`` (200) a map task writes
each block straight to its file, above it Spark sorts its records first (in its execution
memory, spilling to disk). The record budget (``spark.sparkdl.maxRecordBytes``) is never
given up for it: a vector above 200 records gets at least a block per record."""


def shuffle_blocks(vector_bytes: int, requested: int, job_bytes: int | None = None,
                   record_bytes: int = PIECE_BYTES, whole_waves: bool = True) -> int:
    """The number of blocks of a ``vector_bytes`` vector: ``requested``, or more where its
    blocks would exceed ``record_bytes`` (``spark.sparkdl.maxRecordBytes``: as many as that
    needs) or ``job_bytes`` (at most :data:`MAX_SHUFFLE_BLOCKS` for that).

    ``whole_waves`` (``requested`` is then the partitions, the map stage's tasks: the task
    slots the default block count assumes): more blocks than ``requested`` are rounded up to a
    multiple of it where the driver collects their sums in no more jobs and the count stays
    within :data:`MAX_SHUFFLE_BLOCKS` (or was above it already). 3 blocks on 2 slots run
    as two waves of reducers, the second one task on one slot while the other idles, where 4
    smaller blocks run as two full waves: W3's 76 MiB on ``local-cluster[2,1,2048]`` took
    1705 and 1566 ms an iteration in 3 blocks, 1537 and 1497 ms in 4 (bench/RESULTS.md, "W3 on
    ``local-cluster``"). Each job that collects sums runs its own reducers, so smaller blocks
    that take more jobs would add a job's cost each; a ``num_blocks`` the user chose is left
    as given.
    Blocks only cut the vector: every count gives the same sums.

    Example: ``shuffle_blocks(80 << 20, 2)`` is 4 (3 blocks of at most 32 MiB, rounded up)."""
    record_bytes = max(1, int(record_bytes))
    requested = max(1, int(requested))
    largest = record_bytes if job_bytes is None else max(1, min(record_bytes, job_bytes))
    records = -(-int(vector_bytes) // record_bytes)
    needed = max(records, min(MAX_SHUFFLE_BLOCKS, -(-int(vector_bytes) // largest)))
    if needed <= requested:
        return requested
    if not whole_waves:
        return needed
    rounded = -(-needed // requested) * requested

    def jobs(blocks: int) -> int:        # (a block's bytes + a value's rounding to its block)
        return -(-blocks // blocks_per_job(-(-int(vector_bytes) // blocks) + 8, blocks,
                                           job_bytes))
    if jobs(rounded) <= jobs(needed) and (rounded <= MAX_SHUFFLE_BLOCKS
                                          or needed > MAX_SHUFFLE_BLOCKS):
        return rounded
    return needed


def job_intake(vector_bytes: int, path: str, num_partitions: int,
               num_blocks: int | None = None, job_bytes: int | None = None,
               record_bytes: int = PIECE_BYTES) -> int:
    """The most bytes of task results (vectors, before their headers) one job of this
    AllReduce hands the driver: every partition's vector on the driver path; on the shuffle
    path as many blocks as fit in ``job_bytes`` (one at least)."""
    if path == "auto":
        path = choose_allreduce(vector_bytes, num_partitions, job_bytes)
    if path == "driver":
        return int(vector_bytes) * num_partitions
    blocks = _block_count(vector_bytes, num_blocks, num_partitions, job_bytes, record_bytes)
    block = max(1, -(-int(vector_bytes) // blocks))
    return min(int(vector_bytes), blocks_per_job(block, blocks, job_bytes) * block)


def blocks_per_job(block_bytes: int, num_blocks: int, job_bytes: int | None) -> int:
    """How many blocks of ``block_bytes`` one job collects within ``job_bytes`` (one at least;
    None: all ``num_blocks``)."""
    return num_blocks if job_bytes is None else max(1, job_bytes // max(1, block_bytes))


def driver_job_bytes(heap_bytes: int, max_result_bytes: int, chosen: int | None = None,
                     held_bytes: int = 0) -> int:
    """The most bytes of task results one job hands the driver: ``chosen`` (the setting
    ``spark.sparkdl.driverJobBytes``) when given, else :data:`DRIVER_HEAP_SHARE`-th of the heap
    (``heap_bytes``) less the broadcast pieces its block store may hold meanwhile
    (``held_bytes``), and half of ``spark.driver.maxResultSize`` (``max_result_bytes``; 0: no
    limit).

    Example: a 2 GiB heap seeding the pieces of a 1 GiB model's weights (its block store holds
    at most its 1048 MiB pool of them) hands 125 MiB a job, not 256:
    ``driver_job_bytes(2 << 30, 1 << 30, held_bytes=1048 << 20) >> 20``."""
    if chosen:
        return int(chosen)
    limit = max(0, int(heap_bytes) - int(held_bytes)) // DRIVER_HEAP_SHARE
    if max_result_bytes > 0:
        limit = min(limit, int(max_result_bytes) // 2)
    return max(1, limit)


LocalFn = Callable[[int, Any], "tuple[np.ndarray | None, Any]"]
"""A task's function: ``(partition, index record) -> (vector or None, report)``; the report is
carried to the driver as is (it needs a ``partition`` attribute, and ``started_at`` /
``finished_at`` / ``missing_shard`` for the timeline; :class:`sparkdl.executor.step.TaskReport`)."""


@dataclass
class AllReduceResult:
    """The summed vector (None if no partition contributed) and what the tasks reported.

    Wall-clock instants (``time.time()``, comparable across machines only as far as their clocks
    agree): the job's submission, the last reducer's start and end (both 0 without a reduce
    stage), and the results' arrival at the driver. ``broadcast_s``: creating the weights'
    broadcast (set by the runner that made one)."""

    vector: np.ndarray | None
    reduce_s: float = 0.0
    broadcast_s: float = 0.0
    reports: list[Any] = field(default_factory=list)
    submitted_at: float = 0.0
    reduce_started_at: float = 0.0
    reduce_finished_at: float = 0.0
    returned_at: float = 0.0
    rows: dict[Any, Any] | None = None
    """The embedding tables' summed gradient rows by parameter index (a pass's: by
    ``(fit, parameter)`` until :func:`sparkdl.transport.pass_results.split_pass_result`)
    (:mod:`sparkdl.transport.table_rows`), where the AllReduce summed them (the shuffle's
    blocks); else the driver sums the reports'."""
    pending: list[tuple[int, Any]] | None = field(default=None, repr=False)
    """The driver path's encoded vectors by partition, kept only while some partition's shard was
    missing (see :meth:`DriverAllReduce.complete`)."""
    pending_blocks: dict[int, tuple[Any, list[tuple[int, Any]]]] | None = field(
        default=None, repr=False)
    """A DataFrame shuffle's blocks whose sums stopped before a missing partition: by block,
    the reducer's sum so far and the later partitions' encoded blocks (the Spark Connect
    runner completes them once the missing vectors are filled)."""

    def timeline(self) -> dict[str, float]:
        """Seconds of: ``launch_s`` (submission until the last task began computing),
        ``exchange_s`` (the last local vector ready until the last reducer started; the map
        side's writing and the shuffle), ``collect_s`` (the last sum or vector ready until the
        driver held them all). Negative spans from clock skew are reported as 0."""
        started = max((r.started_at for r in self.reports), default=self.submitted_at)
        ready = max((r.finished_at for r in self.reports), default=started)
        if self.reduce_started_at:
            exchange = self.reduce_started_at - ready
            ready = self.reduce_finished_at
        else:
            exchange = 0.0
        return {"launch_s": max(0.0, started - self.submitted_at),
                "exchange_s": max(0.0, exchange),
                "collect_s": max(0.0, self.returned_at - ready)}

    @property
    def missing_partitions(self) -> list[int]:
        return sorted(r.partition for r in self.reports if r.missing_shard)


def with_resources(rdd: RDD, resources: Any) -> RDD:
    """``rdd`` computed in a stage that asks for ``resources`` (a ResourceProfile), if any.
    This creates the RDD's JVM side: mark it :func:`raw_output` first, if it is one."""
    return rdd.withResources(resources) if resources is not None else rdd


def block_bounds(size: int, num_blocks: int) -> np.ndarray:
    """Edges of ``num_blocks`` contiguous, nearly equal blocks of a vector of ``size``."""
    k = max(1, min(int(num_blocks), size))
    return (np.arange(k + 1, dtype=np.int64) * size) // k


def _sum_arrays(arrays: Iterable[np.ndarray]) -> np.ndarray | None:
    """``arrays`` added in the order given (the first copied, never modified)."""
    acc: np.ndarray | None = None
    first: np.ndarray | None = None
    for arr in arrays:
        if first is None:
            first = arr
        elif acc is None:
            acc = np.add(first, arr)        # one pass: the same sum as a copy of first + arr
        else:
            acc += arr
    return acc if acc is not None or first is None else first.copy()


def sum_in_order(parts: Iterable[tuple[int, Any]], codec: Any, lo: int, length: int,
                 absent: dict[int, Any] | None = None) -> np.ndarray | None:
    """The sum of the decoded payloads of ``(partition, payload)`` pairs, added in partition
    order (the order that makes every path bitwise equal); None payloads are skipped.

    ``absent``: by partition, the ranges ``(start, end)`` of whole-vector positions its payload
    holds nothing for (a fit of a pass that took no rows of that partition:
    :class:`sparkdl.executor.tasks.PassReport`); its zeros there are skipped as a None payload
    would be. Each position is the sum of exactly the partitions that have a value there, added
    in partition order, so a fit's part of a pass's vector is bitwise its own run's sum."""
    ordered = [(p, payload) for p, payload in sorted(parts, key=lambda p: p[0])
               if payload is not None]
    holes: dict[int, list[tuple[int, int]]] = {}
    for p, ranges in (absent or {}).items():      # clipped to [lo, lo + length), made relative
        clipped = [(max(a, lo) - lo, min(b, lo + length) - lo) for a, b in ranges
                   if min(b, lo + length) > max(a, lo)]
        if clipped:
            holes[p] = clipped
    if not any(p in holes for p, _ in ordered):
        return _sum_arrays(codec.decode(payload, lo, length) for _, payload in ordered)
    decoded = [(p, codec.decode(payload, lo, length)) for p, payload in ordered]
    cuts = sorted({0, length} | {e for r in holes.values() for pair in r for e in pair})
    pieces = []
    for a, b in zip(cuts[:-1], cuts[1:]):          # the same partitions are present in [a, b)
        present = [arr[a:b] for p, arr in decoded
                   if not any(h0 <= a and b <= h1 for h0, h1 in holes.get(p, ()))]
        piece = _sum_arrays(present)
        pieces.append(piece if piece is not None else np.zeros(b - a, decoded[0][1].dtype))
    return np.concatenate(pieces) if pieces else decoded[0][1][:0].copy()


class ShuffleAllReduce:
    """Block-sharded AllReduce through one shuffle (see the module docstring).

    Embedding tables' rows (the reports' ``table_rows``: :mod:`sparkdl.transport.table_rows`)
    are sharded the same way: reducer ``k`` gets the rows of block ``k`` of each table's id range
    and sums them in partition order; the driver joins the blocks' sums (``result.rows``).

    Args:
        size: length of the vectors.
        dtype: their numpy dtype.
        num_blocks: number of blocks, i.e. of reduce partitions.
        codec: how blocks travel (:mod:`sparkdl.transport.codecs`); default exact.
        table_rows: the number of rows of each embedding table, by parameter index (a pass's:
            by ``(fit, parameter)``).
        job_bytes: the most bytes of sums one job hands the driver (:func:`driver_job_bytes`;
            None: all in one job); a vector above it is collected in several jobs.
        record_bytes: the most bytes of a frame (one record in a JVM) of a block or a sum
            (``spark.sparkdl.maxRecordBytes``).
    """

    def __init__(self, size: int, dtype: np.dtype, num_blocks: int, codec: Any = None,
                 table_rows: dict[Any, int] | None = None, job_bytes: int | None = None,
                 record_bytes: int = MAX_FRAME_BYTES) -> None:
        self.size = int(size)
        self.record_bytes = int(record_bytes)
        self.dtype = np.dtype(dtype)
        self.bounds = block_bounds(size, num_blocks)
        self.num_blocks = len(self.bounds) - 1
        block_bytes = -(-self.size // self.num_blocks) * self.dtype.itemsize
        per_job = blocks_per_job(block_bytes, self.num_blocks, job_bytes)
        self.job_blocks = [list(range(lo, min(lo + per_job, self.num_blocks)))
                           for lo in range(0, self.num_blocks, per_job)]
        """The reduce partitions of each job that collects the sums through the JVM (one job:
        all; sums written to files on a local master are collected in one job)."""
        self._block_mib, self._per_job_mib = block_bytes / 2**20, per_job * block_bytes / 2**20
        self._told = False
        self.codec = codec if codec is not None else ExactCodec(self.dtype)
        # each table's id range cut into the same number of blocks as the vector
        self.row_bounds = {k: (np.arange(self.num_blocks + 1, dtype=np.int64) * n)
                           // self.num_blocks for k, n in (table_rows or {}).items()}
        self._shuffled: JobRdd | None = None     # the last run's shuffle, for complete()
        self._fills: list[JobRdd] = []           # its fills' shuffles, for complete()
        self._jobs = IterationJobs("sparkdl iteration (shuffle all-reduce)")
        self._map_dir: str | None = None          # the last run's map files (a local master)

    def run(self, index_rdd: RDD, local_fn: LocalFn, resources: Any = None) -> AllReduceResult:
        """One job: ``local_fn`` on every partition of ``index_rdd`` (in a stage that asks for
        ``resources``, a ResourceProfile, when given; the reduce stage asks for none)."""
        submitted_at = time.time()
        index = self._jobs.index(index_rdd)
        self.settle()
        local_dir = index.jobs.local_dir
        if local_dir is not None and isinstance(self.codec, ExactCodec):
            self._map_dir = tempfile.mkdtemp(prefix="sparkdl-maps-", dir=local_dir)
        mapped = index.jobs.map_partitions(
            index, ShuffleMapSide(local_fn, self.bounds, self.num_blocks, self.codec,
                                  self.row_bounds, self._map_dir, self.record_bytes), resources)
        self._shuffled = shuffle_frames(mapped, self.num_blocks)
        self._fills = []
        return self._reduce(self._shuffled, submitted_at)

    def settle(self) -> None:
        """The last run's map files removed (once its result, completed or not, is final: the
        next :meth:`run` does it too)."""
        if self._map_dir is not None:
            shutil.rmtree(self._map_dir, ignore_errors=True)
            self._map_dir = None

    def fill_side(self) -> "ShuffleMapSide":
        """What a fill job's tasks emit their vectors with (:meth:`ShuffleMapSide.emit`;
        they compute the vectors themselves): the last :meth:`run`'s blocks, codec and map
        files."""
        return ShuffleMapSide(None, self.bounds, self.num_blocks, self.codec, self.row_bounds,
                              self._map_dir, self.record_bytes)

    def complete(self, result: AllReduceResult, fill_map: JobRdd | None
                 ) -> tuple[AllReduceResult, dict[int, Any]]:
        """``result`` with the partitions that ``fill_map`` computes (a fill job's map tasks,
        which emit their vectors through :meth:`fill_side`'s :meth:`ShuffleMapSide.emit`) in
        place of their missing ones, and the shard summaries those tasks carried, by
        partition. The fill's frames go through a shuffle of their own, with the same blocks
        and partitioner, and each reducer reads the run's shuffle and every fill's so far as
        one union (:func:`~sparkdl.transport.filled_blocks.union_frames`): only the fills'
        map tasks and the reduce stage run (the run's map stage is skipped; partitions whose
        map output was lost are computed again), and no vector passes through the driver.
        Each reducer sums its block of every partition, filled ones included, in partition
        order: bitwise the sum an undisturbed job gives. ``fill_map`` None: the reduce stage
        again over the fills so far."""
        assert self._shuffled is not None, "complete() follows run()"
        if fill_map is not None:
            self._fills.append(shuffle_frames(fill_map, self.num_blocks))
        result = self._reduce(union_frames([self._shuffled, *self._fills]),
                              result.submitted_at)
        return unwrap_filled(result)

    def _tell(self, result_dir: str | None, jobs: int) -> None:
        """Say once how the sums reach the driver, when it is not one job's results."""
        if self._told:
            return
        self._told = True
        if result_dir is not None:
            log.info("the vectors and the sums of %d blocks travel as files on this machine (a "
                     "local master), not through the JVM%s", self.num_blocks,
                     "" if self._map_dir is not None else
                     " (the sums only: compressed vectors go through the shuffle)")
        elif jobs > 1:
            log.info("the sums of %d blocks of %.1f MiB reach the driver in %d jobs of at most "
                     "%.1f MiB each (a job's share of the driver's heap beside the weights' "
                     "broadcast pieces, and of spark.driver.maxResultSize)", self.num_blocks,
                     self._block_mib, jobs, self._per_job_mib)

    def _check_blocks(self, messages: list[tuple[Any, Any]]) -> None:
        """Every block's sum came once, and either every block holds one or none does (no
        partition contributed): the summed vector starts uninitialised, so a block left out
        must be an error, never values."""
        blocks = sorted(head[0] for head, _ in messages)
        if blocks != list(range(self.num_blocks)):
            missing = sorted(set(range(self.num_blocks)) - set(blocks))
            raise EOFError(f"the AllReduce's results hold the sums of blocks {blocks[:20]} "
                           f"(missing {missing[:20]}) of {self.num_blocks}: a reducer's result "
                           "was cut short")
        written = [head[0] for head, payload in messages
                   if payload is not None or head[-1] is not None]
        if written and len(written) != self.num_blocks:
            empty = sorted(set(blocks) - set(written))
            raise EOFError(f"the AllReduce's reducers of blocks {empty[:20]} returned no sum "
                           f"while those of {len(written)} other blocks did: their inputs "
                           "were cut short")

    def _reduce(self, shuffled: JobRdd, submitted_at: float) -> AllReduceResult:
        """The reduce stage over ``shuffled`` (the last run's shuffle, or its union with the
        fills' shuffles: a partition's later map output replaces its earlier one), collected."""
        result_dir = shuffled.jobs.local_dir
        reduce_side = ShuffleReduceSide(self.bounds, self.codec, self.row_bounds,
                                        self.num_blocks, self.dtype, result_dir,
                                        self.record_bytes)
        bounds = self.bounds
        vector = np.empty(self.size, dtype=self.dtype)
        reduced = shuffled.jobs.map_partitions(shuffled, reduce_side)
        groups = self.job_blocks if len(self.job_blocks) > 1 and not result_dir else [None]
        self._tell(result_dir, len(groups))
        messages = []
        for group in groups:        # each block's sum read straight into its place
            messages += collect_messages(
                reduced, lambda head: vector[bounds[head[0]]:bounds[head[0] + 1]],
                self._jobs.call_site, group, self.num_blocks if group is None else len(group))
        self._check_blocks(messages)
        for (k, *_, where), _payload in messages:
            if where is not None:   # a local master's reducer wrote its sum to a file
                read_sum_file(where, vector[bounds[k]:bounds[k + 1]])
        result = AllReduceResult(vector, submitted_at=submitted_at, returned_at=time.time())
        block_rows: dict[int, dict[Any, Rows]] = {}
        for (k, block_reports, seconds, started, finished, row_sums, where), payload in \
                messages:
            block_rows[k] = row_sums
            result.reports.extend(block_reports)
            result.reduce_s = max(result.reduce_s, seconds)
            result.reduce_started_at = max(result.reduce_started_at, started)
            result.reduce_finished_at = max(result.reduce_finished_at, finished)
            if payload is None and where is None:
                result.vector = None
        result.reports.sort(key=lambda r: r.partition)
        if self.row_bounds:       # the blocks' id ranges are disjoint and ascending
            result.rows = {p: join_rows([block_rows[k][p] for k in sorted(block_rows)])
                           for p in self.row_bounds
                           if any(p in block_rows[k] for k in block_rows)}
        return result


@dataclass
class ShuffleMapSide:
    """The shuffle's map task (executor side): ``local_fn``'s vector cut into blocks, block
    ``k`` (with that block's table rows, and the report with block 0) sent to reducer ``k``.
    An instance of an importable class, so each iteration's job pickles it by reference."""

    local_fn: Any
    bounds: np.ndarray
    num_blocks: int
    codec: Any
    row_bounds: dict[Any, np.ndarray]     # by parameter, or a pass's (fit, parameter)
    map_dir: str | None = None            # a local master's: the vector goes to a file there
    frame_bytes: int = MAX_FRAME_BYTES    # the largest frame (JVM record) of a block

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[Any]:
        summaries = list(records)
        vector, report = self.local_fn(partition, summaries[0] if summaries else None)
        yield from self.emit(partition, vector, report)

    def emit(self, partition: int, vector: np.ndarray | None, report: Any,
             summary: Any = None) -> Iterator[Any]:
        """The keyed frames of ``partition``'s vector and report (``summary``: the shard
        summary of a fill task, carried with the report as a
        :class:`~sparkdl.transport.filled_blocks.FilledReport`)."""
        report, rows = _rows_by_block(report, self.row_bounds, self.num_blocks)
        absent = getattr(report, "absent", ())
        if summary is not None:
            report = FilledReport(report, summary)
        bounds = self.bounds
        where = None
        if vector is not None and vector.size and self.map_dir is not None:
            # one file the reducers read their blocks from; the shuffle carries its name. A
            # map directory is made for the exact codec only: the file is the vector in the
            # sum's dtype, written as it is (a segmented vector segment by segment)
            where = write_vector_file(self.map_dir, f"map-{partition}",
                                      vector if vector.dtype == self.codec.dtype else
                                      self.codec.encode(vector, 0))
        for k in range(self.num_blocks):
            block = (None if vector is None or where is not None else
                     self.codec.encode(vector[bounds[k]:bounds[k + 1]], int(bounds[k])))
            for frame in message_frames((partition, report if k == 0 else None, rows[k],
                                         absent, where), block, self.frame_bytes):
                yield from keyed_frame(k, frame)


@dataclass
class ShuffleReduceSide:
    """The shuffle's reduce task (executor side): block ``k`` of every partition summed in
    partition order. A partition's later map output replaces an earlier one: the frames of a
    fill job's shuffle follow those of the run's (:func:`~sparkdl.transport.filled_blocks.
    union_frames`), so a filled partition's vector and report replace its missing ones."""

    bounds: np.ndarray
    codec: Any
    row_bounds: dict[Any, np.ndarray]
    num_blocks: int
    dtype: np.dtype
    result_dir: str | None = None     # a local master's: the sum goes to a file there
    frame_bytes: int = MAX_FRAME_BYTES    # the largest frame (JVM record) of the sum

    def __call__(self, k: int, frames: Iterator[bytes]) -> Iterator[Any]:
        started_at, t0 = time.time(), time.perf_counter()
        codec, row_bounds = self.codec, self.row_bounds
        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        latest: dict[int, tuple[Any, Any, Any, Any]] = {}
        for (partition, report, rows, holes, where), payload in read_messages(frames):
            if where is not None:       # the map task's vector in a file: this block of it
                payload = np.memmap(where, dtype=self.dtype, mode="r", shape=(hi - lo,),
                                    offset=lo * self.dtype.itemsize)
            latest[partition] = (payload, report, rows, holes)
        parts = [(p, payload) for p, (payload, _, _, _) in latest.items()]
        row_parts = [(p, rows) for p, (_, _, rows, _) in latest.items()]
        absent = {p: holes for p, (_, _, _, holes) in latest.items()}
        reports = [report for _, report, _, _ in latest.values() if report is not None]
        total = sum_in_order(parts, codec, lo, hi - lo, absent)
        row_sums = _sum_row_parts(row_parts, row_bounds, self.dtype)
        where = None
        if self.result_dir is not None and total is not None:
            where = write_sum_file(self.result_dir, k, total)
            total = None
        yield from message_frames(
            (k, reports, time.perf_counter() - t0, started_at, time.time(), row_sums, where),
            total, self.frame_bytes)


def write_vector_file(directory: str, name: str, values: np.ndarray | SegmentedVector) -> str:
    """``values`` written to a new file under ``directory`` (``name`` and a suffix of its own
    per task attempt: a retried or speculative task never writes over another's); its path."""
    path = os.path.join(directory, f"{name}-{uuid.uuid4().hex}")
    with open(path, "wb") as out:
        write_vector(out, values)
    return path


def write_sum_file(directory: str, k: int, total: np.ndarray) -> str:
    """Block ``k``'s sum written to a new file under ``directory``: its path."""
    return write_vector_file(directory, f"sparkdl-sum-{k}", total)


def read_sum_file(path: str, target: np.ndarray) -> None:
    """A block's sum from the file :func:`write_sum_file` wrote, read into ``target`` (its place
    in the summed vector); the file removed."""
    with open(path, "rb", buffering=0) as f:
        read_exactly(f, target, f"{path}: a reducer's sum is shorter than {target.nbytes} "
                                "bytes")
    os.unlink(path)


@dataclass
class DriverMapSide:
    """The driver path's task (executor side): ``local_fn``'s whole vector and report."""

    local_fn: Any
    codec: Any
    frame_bytes: int = MAX_FRAME_BYTES    # the largest frame (JVM record) of the vector

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[Any]:
        summaries = list(records)
        vector, report = self.local_fn(partition, summaries[0] if summaries else None)
        yield from message_frames(report, None if vector is None else
                                  self.codec.encode(vector, 0), self.frame_bytes)


def _rows_by_block(report: Any, row_bounds: dict[Any, np.ndarray], num_blocks: int
                   ) -> tuple[Any, list[dict[Any, Rows] | None]]:
    """The report without its tables' rows, and those rows cut into the blocks' id ranges (one
    dict by parameter per block; None per block when there are none)."""
    rows = getattr(report, "table_rows", None)
    if not rows:
        return report, [None] * num_blocks
    report = dataclasses.replace(report, table_rows=None)
    cut = {p: split_rows(r, row_bounds[p]) for p, r in rows.items()}
    return report, [{p: parts[k] for p, parts in cut.items()} for k in range(num_blocks)]


def _sum_row_parts(row_parts: list[tuple[int, dict[Any, Rows] | None]],
                   row_bounds: dict[Any, np.ndarray], dtype: np.dtype) -> dict[Any, Rows]:
    """One block's rows of every table, summed over partitions in partition order."""
    ordered = [rows for _, rows in sorted(row_parts, key=lambda pr: pr[0]) if rows]
    return {p: sum_rows([rows.get(p) for rows in ordered], dtype) for p in row_bounds
            if any(p in rows for rows in ordered)}


class DriverAllReduce:
    """One-stage AllReduce: tasks return whole vectors, the driver sums them in partition order."""

    def __init__(self, size: int, dtype: np.dtype, codec: Any = None,
                 record_bytes: int = MAX_FRAME_BYTES) -> None:
        self.size = int(size)
        self.dtype = np.dtype(dtype)
        self.record_bytes = int(record_bytes)
        self.codec = codec if codec is not None else ExactCodec(self.dtype)
        self._jobs = IterationJobs("sparkdl iteration (driver all-reduce)")

    def settle(self) -> None:
        """Nothing to remove: the vectors travel as the tasks' results."""

    def run(self, index_rdd: RDD, local_fn: LocalFn, resources: Any = None) -> AllReduceResult:
        """One job, one stage (asking for ``resources`` when given)."""
        submitted_at = time.time()
        index = self._jobs.index(index_rdd)
        mapped = index.jobs.map_partitions(
            index, DriverMapSide(local_fn, self.codec, self.record_bytes), resources)
        messages = collect_messages(mapped, lambda head: None, self._jobs.call_site,
                                    expected=self._jobs.num_partitions)
        returned_at, t0 = time.time(), time.perf_counter()
        parts = [(r.partition, b) for r, b in messages]
        reports = sorted((r for r, _ in messages), key=lambda r: r.partition)
        vector = sum_in_order(parts, self.codec, 0, self.size, reported_absent(reports))
        missing = any(getattr(r, "missing_shard", False) for r in reports)
        return AllReduceResult(vector, reduce_s=time.perf_counter() - t0, reports=reports,
                               submitted_at=submitted_at, returned_at=returned_at,
                               pending=parts if missing else None)

    def complete(self, result: AllReduceResult, filled: dict[int, tuple[Any, Any]]
                 ) -> AllReduceResult:
        """``result`` with the ``(vector, report)`` of the ``filled`` partitions (computed by
        another job) in place of their missing ones, summed again in partition order: bitwise
        the sum an undisturbed job gives."""
        assert result.pending is not None
        t0 = time.perf_counter()
        parts = dict(result.pending)
        reports = {r.partition: r for r in result.reports}
        for partition, (vector, report) in filled.items():
            parts[partition] = None if vector is None else self.codec.encode(vector, 0)
            reports[partition] = report
        ordered = sorted(reports.values(), key=lambda r: r.partition)
        missing = any(getattr(r, "missing_shard", False) for r in ordered)
        return AllReduceResult(sum_in_order(parts.items(), self.codec, 0, self.size,
                                            reported_absent(ordered)),
                               reduce_s=result.reduce_s + time.perf_counter() - t0,
                               reports=ordered, submitted_at=result.submitted_at,
                               returned_at=result.returned_at,
                               pending=list(parts.items()) if missing else None)


def reported_absent(reports: Iterable[Any]) -> dict[int, Any]:
    """The reports' absent ranges by partition (a pass's fits without rows there)."""
    return {r.partition: r.absent for r in reports if getattr(r, "absent", ())}


def make_pass_allreduce(size: int, dtype: np.dtype, path: str, num_partitions: int,
                        num_blocks: int | None = None, codec: Any = None,
                        table_rows: dict[Any, int] | None = None, job_bytes: int | None = None,
                        record_bytes: int = PIECE_BYTES) -> "ShuffleAllReduce | DriverAllReduce":
    """The AllReduce of a pass's vectors: every fit's vector, one after another, ``size``
    values of ``dtype`` in all (:mod:`sparkdl.engine.fit_set`), through ``codec``
    (:func:`sparkdl.transport.codecs.make_pass_codec`; default exact), every fit's embedding
    tables' rows (``table_rows``: their row counts by ``(fit, parameter)``) summed by block on
    the shuffle path (``job_bytes``, ``record_bytes``: as :class:`ShuffleAllReduce`'s)."""
    dtype = np.dtype(dtype)
    if path == "auto":
        path = choose_allreduce(size * dtype.itemsize, num_partitions, job_bytes)
    if path == "driver":
        return DriverAllReduce(size, dtype, codec, record_bytes)
    return ShuffleAllReduce(size, dtype, _blocks(size * dtype.itemsize, num_blocks,
                                                 num_partitions, job_bytes, record_bytes),
                            codec, table_rows, job_bytes, record_bytes)


def _block_count(vector_bytes: int, num_blocks: int | None, num_partitions: int,
                 job_bytes: int | None, record_bytes: int) -> int:
    """The blocks a vector's shuffle makes: the user's ``num_blocks`` as given (more only where
    the budgets need it), else the partitions', in whole waves (:func:`shuffle_blocks`)."""
    return shuffle_blocks(vector_bytes, num_blocks or num_partitions, job_bytes, record_bytes,
                          whole_waves=not num_blocks)


def _blocks(vector_bytes: int, num_blocks: int | None, num_partitions: int,
            job_bytes: int | None, record_bytes: int) -> int:
    blocks = _block_count(vector_bytes, num_blocks, num_partitions, job_bytes, record_bytes)
    if num_blocks and blocks > num_blocks:
        log.warning("num_blocks=%d would make %.1f MiB blocks, more than one job may hand the "
                    "driver or one broadcast piece: using %d blocks (the same sums: blocks only "
                    "cut the vector)", num_blocks, vector_bytes / num_blocks / 2**20, blocks)
    return blocks


def make_allreduce(layout: ParamLayout, path: str, num_partitions: int,
                   num_blocks: int | None = None, compression: str | None = None,
                   job_bytes: int | None = None, record_bytes: int = PIECE_BYTES
                   ) -> "ShuffleAllReduce | DriverAllReduce":
    """The AllReduce for ``path`` ("auto", "shuffle" or "driver") over vectors of ``layout``
    (``job_bytes``, ``record_bytes``: as :class:`ShuffleAllReduce`'s)."""
    codec = make_codec(compression, layout.numpy_dtype, layout.num_param_values)
    vector_bytes = layout.size * layout.numpy_dtype.itemsize
    if path == "auto":
        path = choose_allreduce(vector_bytes, num_partitions, job_bytes)
    if path == "driver":
        return DriverAllReduce(layout.size, layout.numpy_dtype, codec, record_bytes)
    return ShuffleAllReduce(layout.size, layout.numpy_dtype,
                            _blocks(vector_bytes, num_blocks, num_partitions, job_bytes,
                                    record_bytes), codec,
                            {k: layout.params[k].shape[0] for k in layout.tables}, job_bytes,
                            record_bytes)
