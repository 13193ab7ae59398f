"""Driver side of the executor-held shards (see :mod:`sparkdl.shards`).

``CachedData`` turns a user's RDD of ``(features, label)`` pairs into shards on the executors with
one Spark job and keeps a tiny cached RDD (one small summary record per partition) whose cached
blocks sit on the executors that hold the shards. Every iteration's job runs over that tiny RDD,
so Spark's locality sends task ``i`` to where shard ``i`` lives, and only the summary record
(not the data) goes from the JVM to Python.

The tiny RDD sits behind a shuffle keyed by partition index (summary ``i`` goes to partition
``i``): its tasks then carry small shuffle partitions instead of the user's partitions (which for
``sc.parallelize`` hold the data itself and would be shipped with every iteration's tasks), and
Spark's reduce-side locality still places partition ``i`` where map task ``i`` built shard ``i``.

If an executor is lost, its cached blocks and map outputs are lost with it and Spark re-runs the
lost build tasks from the lineage, which rebuilds the shards on a live executor inside the same
job. If a task lands on an executor without the shard anyway, it reports it, and
:meth:`CachedData.rebuild` builds everything again before the iteration is re-run.
"""

from __future__ import annotations

import logging
import shutil
import os
import uuid
from typing import Any

from pyspark import RDD, StorageLevel

from .shards import ShardSummary

__all__ = ["CachedData", "clean_workers"]

log = logging.getLogger(__name__)


def _make_builder(data_key: str, float_dtype: str) -> Any:
    def build_partition(partition: int, records: Any) -> Any:
        from sparkdl.shards import build_shard

        summary = build_shard(data_key, partition, records, float_dtype)
        summary.build_id = uuid.uuid4().hex
        yield partition, summary

    return build_partition


def _own_partition(partition: int) -> int:
    return partition


def _make_dropper(data_keys: list[str]) -> Any:
    def drop(_: Any) -> Any:
        from sparkdl.replica import drop_replica
        from sparkdl.shards import drop_run

        for key in data_keys:
            drop_run(key)
            drop_replica(key)
        return []

    return drop


class CachedData:
    """An RDD of ``(features, label)`` pairs held as shards on the executors.

    Args:
        rdd: the user's RDD (not modified, never unpersisted by sparkdl).
        float_dtype: numpy dtype string that floating features and labels are stored in.
        name: a word for the logs ("training", "validation").
    """

    def __init__(self, rdd: RDD, float_dtype: str, name: str) -> None:
        self.rdd = rdd
        self.float_dtype = float_dtype
        self.name = name
        self.data_key = f"{name}-{uuid.uuid4().hex[:12]}"
        self.index_rdd: RDD | None = None
        self.summaries: list[ShardSummary] = []

    @property
    def num_partitions(self) -> int:
        return self.rdd.getNumPartitions()

    def build(self) -> list[ShardSummary]:
        """Convert every partition into a shard on its executor (one Spark job)."""
        if self.index_rdd is not None:
            self.index_rdd.unpersist(blocking=False)
        builder = _make_builder(self.data_key, self.float_dtype)
        self.index_rdd = self.rdd.mapPartitionsWithIndex(builder).partitionBy(
            self.num_partitions, _own_partition).persist(StorageLevel.MEMORY_ONLY)
        self.index_rdd.setName(f"sparkdl {self.name} shards {self.data_key}")
        self.summaries = [s for _, s in sorted(self.index_rdd.collect(), key=lambda r: r[0])]
        log.info("%s data: %d samples in %d partitions held as shards on the executors",
                 self.name, sum(s.count for s in self.summaries), len(self.summaries))
        return self.summaries

    def rebuild(self, partitions: list[int]) -> None:
        """Build all shards again because ``partitions`` were not found where their task ran."""
        log.warning("%s shards of partitions %s were not found on the executors that ran their "
                    "tasks (executor lost or cache evicted); rebuilding them from the RDD lineage",
                    self.name, partitions)
        self.build()

    def release(self) -> None:
        """Unpersist the index RDD and delete the shard files this machine can reach."""
        if self.index_rdd is None:
            return
        sc = self.index_rdd.context
        self.index_rdd.unpersist(blocking=False)
        self.index_rdd = None
        del sc
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
        sc.parallelize(range(width), width).foreachPartition(_make_dropper(keys))
    except Exception as exc:  # cleanup must never hide the training result
        log.debug("cleanup of %s on the executors failed: %s", keys, exc)
