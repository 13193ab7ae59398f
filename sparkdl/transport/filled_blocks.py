"""Placement misses' vectors through the shuffle AllReduce's own blocks (driver and executor).

A task that ran where its partition's shard is not reports the miss; a fill job builds that
shard where its task runs and computes the same step there
(:meth:`sparkdl.runners.cached_rdd.CachedData.fill_map`). On the shuffle path the fill tasks
are map tasks of a shuffle of their own, with the run's blocks and partitioner: each emits its
vector as keyed blocks (:meth:`sparkdl.transport.allreduce.ShuffleMapSide.emit`) and its shard
summary with its report (:class:`FilledReport`). :func:`union_frames` joins the run's shuffle
and the fills' block by block (Spark's partitioner-aware union: reducer ``k`` reads block ``k``
of the run's map outputs, then of each fill's), so the reducers read every filled vector from
the shuffle, a filled partition's output after (and instead of) its missing one; the driver
receives the sums and small reports only (:func:`unwrap_filled` takes the summaries out).

Example::

    fills = jobs.map_partitions(pruned_input, fill_task)      # fill_task calls side.emit
    both = union_frames([run_shuffle, shuffle_frames(fills, num_blocks)])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .python_jobs import JobRdd

if TYPE_CHECKING:       # the AllReduce imports this module
    from .allreduce import AllReduceResult

__all__ = ["FilledReport", "union_frames", "unwrap_filled"]


@dataclass
class FilledReport:
    """A fill task's report with the summary of the shard it built (what the driver checks
    against the first build), carried in its block 0 header as a map task's report is."""

    report: Any
    summary: Any

    @property
    def partition(self) -> int:
        return int(self.report.partition)


def union_frames(parts: Sequence[JobRdd]) -> JobRdd:
    """The shuffled frames of ``parts`` (RDDs of the same partitioner, as
    :func:`~sparkdl.transport.frames.shuffle_frames` makes them for the same number of blocks)
    as one RDD of as many partitions: partition ``k`` holds partition ``k`` of each, in the
    order given. ``parts`` alone: the first unchanged."""
    first = parts[0]
    if len(parts) == 1:
        return first
    sc = first.jobs.sc
    jvm = sc._jvm
    rdds = jvm.java.util.ArrayList()
    for part in parts:
        rdds.add(part.jrdd)
    tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("java.lang.Object"))
    joined = sc._jsc.sc().union(jvm.scala.collection.JavaConverters.asScalaBuffer(rdds).toList(),
                                tag)
    width = first.jrdd.getNumPartitions()
    if joined.getNumPartitions() != width:       # not partitioner-aware: a bug, never silent
        raise RuntimeError(f"the union of {len(parts)} shuffles of {width} blocks has "
                           f"{joined.getNumPartitions()} partitions")
    return JobRdd(first.jobs, joined, first.deserializer)


def unwrap_filled(result: "AllReduceResult") -> "tuple[AllReduceResult, dict[int, Any]]":
    """``result`` with the fill tasks' own reports in place of their :class:`FilledReport`,
    and the shard summaries those carried, by partition."""
    summaries = {r.partition: r.summary for r in result.reports if isinstance(r, FilledReport)}
    if not summaries:
        return result, summaries
    reports = [r.report if isinstance(r, FilledReport) else r for r in result.reports]
    return dataclasses.replace(result, reports=reports), summaries
