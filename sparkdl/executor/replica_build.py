"""The replica job's task (executor side): builds a shard again on a chosen executor.

:meth:`sparkdl.runners.cached_rdd.CachedData._replica_job` runs it over the cartesian product of
a targeted RDD (where the task should run) and the user's RDD, diagonal partitions only, so
task ``p * width + p`` receives partition ``p``'s records, each paired with ``p`` (a job of its
own each). The Python functions of the user's lineage (a pyspark ``PipelinedRDD``'s ``func``)
run in this task too (``lineage``), over the records of the JVM RDD below them, so that the
task needs one Python worker, as the first build did, not a second one that has run nothing
yet. This module imports neither torch nor the training step (about 0.06 s in a fresh worker,
against more than a second for :mod:`sparkdl.executor.tasks`).

Example::

    product.mapPartitionsWithIndex(ReplicaBuildTask(data_key, width, "float32"))   # a summary
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .live_runs import LiveRuns, evict_finished
from .shard_store import ShardSummary, build_shard

__all__ = ["ReplicaBuildTask", "as_collected"]


def as_collected(rows: Iterator[Any]) -> Iterator[Any]:
    """The ``runJob`` function of the replica and fill jobs: their rows as they are. It lives
    here, not in the driver's module, because Spark ships it to the tasks by reference:
    unpickling a function of :mod:`sparkdl.runners` imports that package (pandas, pyspark.ml,
    torch), 1-3 s in a fresh Python worker."""
    return rows


@dataclass
class ReplicaBuildTask:
    """Builds the shard of user partition ``index // width`` from its ``(partition, record)``
    pairs, where this task runs, as the first build did
    (:class:`sparkdl.executor.tasks.ShardBuildTask`)."""

    data_key: str
    width: int           # the user RDD's partitions
    float_dtype: str
    place: str = "disk"
    ragged: tuple[int, ...] = ()
    live: LiveRuns | None = None
    lineage: Callable[[int, Iterator[Any]], Iterator[Any]] | None = None
    """The user's Python functions over the JVM RDD's records (``PipelinedRDD.func``), if any."""

    def __call__(self, index: int, pairs: Iterator[Any]) -> Iterator[ShardSummary]:
        partition = index // self.width       # product partition p * width + q; q == p here
        evict_finished(self.live)
        raw = (record for _, record in pairs)
        rows = raw if self.lineage is None else self.lineage(partition, raw)
        yield build_shard(self.data_key, partition, rows, self.float_dtype, self.place,
                          self.ragged)
