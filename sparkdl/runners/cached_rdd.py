"""Driver side of the executor-held shards of an RDD (see :mod:`sparkdl.executor.shard_store`).

``CachedData`` turns a user's RDD of ``(features, label)`` pairs into shards on the executors with
one Spark job and keeps a tiny cached RDD (one small summary record per partition) whose cached
blocks sit on the executors that hold the shards. Every iteration's job runs over that tiny RDD,
so Spark's locality sends task ``i`` to where shard ``i`` lives, and only the summary record
(not the data) goes from the JVM to Python.

The tiny RDD is persisted and *locally checkpointed*: the task that builds shard ``i`` also stores
summary ``i`` in its executor's block manager, and the RDD's lineage is then cut, so iteration
tasks carry tiny checkpoint partitions (not the user's partitions, which for ``sc.parallelize``
hold the data itself) and Spark's locality sends them to the very executor that built their shard.

Two ways of losing a shard, two repairs:

* A *placement miss*: Spark ran a task where its shard is not (the locality wait ran out, a new
  executor, another Python worker with ``"memory"`` shards). The task reports it and
  :meth:`CachedData.fill` runs a job over the user's RDD for exactly those partitions: each fill
  task builds its partition's shard where it runs (later iterations there find it) and computes
  the same step on it. Only the missing shards are built, wherever the scheduler puts the tasks,
  and a miss never fails a run.
* A *lost executor*: its checkpointed blocks are lost with it and the iteration's job fails with
  Spark's "Checkpoint block ... not found"; the engine recognises that (:func:`lost_data_reason`),
  rebuilds all shards and the index with :meth:`CachedData.rebuild` and re-runs the iteration,
  which is deterministic.

Every rebuilt shard is checked against the first build (sample count and content hash): an input
RDD that does not give back the same samples is a :class:`~sparkdl.errors.TrainingDataError`.
Rebuilt shards and misses are counted (``shards_rebuilt``, ``placement_misses``) for the
training summary.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from pyspark import RDD, StorageLevel

from ..executor.shard_store import ShardSummary
from ..executor.tasks import CleanupTask, FillTask
from ..transport.allreduce import with_resources
from .held_data import HeldData, check_unchanged

__all__ = ["CachedData", "check_unchanged", "clean_workers", "driver_memory_reason",
           "lost_data_reason", "memory_kill_reason",
           "shard_place"]

_LOST_DATA_MARKERS = ("Checkpoint block", "ExecutorLostFailure", "FetchFailed")
_MEMORY_KILL_MARKERS = ("exceeding memory limits", "exceeding physical memory",
                        "exceeding virtual memory", "OOMKilled", "possible container OOM",
                        "java.lang.OutOfMemoryError")
"""How YARN, Kubernetes and the JVM say that an executor died for memory."""


_TASK_FAILURE_MARKERS = ("Lost task", "stage failure", "ExecutorLostFailure", "executor ")


def driver_memory_reason(exc: BaseException) -> str | None:
    """The line saying that the driver's own JVM ran out of heap, or None: a
    ``java.lang.OutOfMemoryError`` thrown by the driver's call itself (the first Java exception
    of a py4j error), not one a task or an executor reported."""
    text = str(exc)
    lines = [line.strip(" :") for line in text.splitlines() if line.strip()]
    first_java = next((line for line in lines if "Exception" in line or "Error:" in line
                       or line.startswith("java.")), "")
    if "java.lang.OutOfMemoryError" not in first_java:
        return None
    if any(marker in text for marker in _TASK_FAILURE_MARKERS):
        return None
    return first_java[:300]


def memory_kill_reason(exc: BaseException) -> str | None:
    """The line saying that an executor was killed for exceeding its memory, or None (a driver
    out of heap is not one: :func:`driver_memory_reason`)."""
    if driver_memory_reason(exc) is not None:
        return None
    for line in str(exc).splitlines():
        if any(marker in line for marker in _MEMORY_KILL_MARKERS):
            return line.strip(" :")[:300]
    return None


def lost_data_reason(exc: BaseException) -> str | None:
    """If a Spark job failed because executor-held data was lost (a lost executor), which a
    rebuild of the shards repairs, the line of the error that says so; otherwise None."""
    for line in str(exc).splitlines():
        if any(marker in line for marker in _LOST_DATA_MARKERS):
            return line.strip(" :")[:300]
    return None


log = logging.getLogger(__name__)


def shard_place(conf: Any) -> str:
    """Where executors keep shards under this Spark configuration: ``"memory"`` when
    ``spark.io.encryption.enabled`` asks that nothing reach the executors' disks unencrypted,
    ``"disk"`` otherwise (see :mod:`sparkdl.executor.shard_store`)."""
    enabled = str(conf.get("spark.io.encryption.enabled", "false") or "false")
    return "memory" if enabled.strip().lower() == "true" else "disk"


def _rows(rows: Any) -> Any:
    return rows


class CachedData(HeldData):
    """An RDD of ``(features, label)`` pairs held as shards on the executors (RDD jobs;
    everything else is :class:`~sparkdl.runners.held_data.HeldData`'s).

    Args:
        rdd: the user's RDD (not modified, never unpersisted by sparkdl).
        float_dtype, name, place, ragged: as for :class:`~sparkdl.runners.held_data.HeldData`.
    """

    source = "the RDD lineage"

    def __init__(self, rdd: RDD, float_dtype: str, name: str, place: str = "disk",
                 ragged: tuple[int, ...] = ()) -> None:
        super().__init__(float_dtype, name, place, ragged)
        self.rdd = rdd
        self.index_rdd: RDD | None = None

    @property
    def num_partitions(self) -> int:
        return self.rdd.getNumPartitions()

    def _build(self) -> list[ShardSummary]:
        if self.index_rdd is not None:
            self.index_rdd.unpersist(blocking=False)
        self.index_rdd = self.rdd.mapPartitionsWithIndex(self.builder)
        self.index_rdd.setName(f"sparkdl {self.name} shards {self.data_key}")
        # persist() also stops pyspark from pipelining later stages into the build function;
        # localCheckpoint() then cuts the lineage once the blocks exist.
        self.index_rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self.index_rdd.localCheckpoint()
        return self.index_rdd.collect()

    def _fill(self, partitions: list[int], task: Any, resources: Any
              ) -> dict[int, tuple[ShardSummary, Any]]:
        fill = FillTask(self.builder, task)
        rdd = with_resources(self.rdd.mapPartitionsWithIndex(fill), resources)
        return {summary.partition: (summary, result)
                for summary, result in self.rdd.context.runJob(rdd, _rows, partitions)}

    def release(self) -> None:
        """Unpersist the index RDD and delete the shard files this machine can reach."""
        if self.index_rdd is None:
            return
        self.index_rdd.unpersist(blocking=False)
        self.index_rdd = None
        dirs = {s.executor_dir for s in self.summaries if s.executor_dir}
        for d in dirs:  # in local mode the executor's files are on this machine
            shutil.rmtree(os.path.join(d, self.data_key), ignore_errors=True)


def clean_workers(sc: Any, keys: list[str]) -> None:
    """Drop the shards and replicas of ``keys`` in the Python workers (one small job, best effort).

    A task cannot be sent to every worker on purpose, so this covers the common case; whatever it
    misses is evicted by the workers' bounded caches and deleted with the application's work dir.
    """
    try:
        width = max(2, sc.defaultParallelism) * 2
        sc.parallelize(range(width), width).foreachPartition(CleanupTask(list(keys)))
    except Exception as exc:  # cleanup must never hide the training result
        log.debug("cleanup of %s on the executors failed: %s", keys, exc)
