"""What every Spark runner does with the data it holds on the executors, whatever runs its jobs.

:class:`HeldData` is the one data handle of the Spark runners: shards built by one job, rebuilt
whole after a loss, filled one partition at a time after a placement miss, each rebuilt shard
checked against the first build, and the counts the summary reports. A subclass only says how a
job runs: :class:`sparkdl.runners.cached_rdd.CachedData` with RDD jobs,
:class:`sparkdl.runners.connect_dataframe.ConnectData` with DataFrame jobs.

:func:`complete_misses` is the one repair loop of an iteration (and a validation): partitions
whose task found no shard are filled (their step computed where their shard is built), and the
runner completes the iteration with those vectors, summed in partition order, so the result is
bitwise the undisturbed one.

Example::

    result = complete_misses(result, lambda missing: data.fill(missing, task),
                             lambda result, filled: allreduce.complete(result, filled),
                             data.num_partitions)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import SparkdlError, TrainingDataError, raise_reported
from ..executor.live_runs import live_runs, new_key
from ..executor.shard_store import ShardSummary
from ..executor.step import PartitionMetrics
from .interface import DataHandle
from ..executor.tasks import ShardBuildTask

__all__ = ["HeldData", "check_unchanged", "complete_misses", "not_found"]

log = logging.getLogger(__name__)


def check_unchanged(name: str, old: ShardSummary, new: ShardSummary, hint: str = "") -> None:
    """A rebuilt shard must hold the samples the batch plan was made for."""
    if old.error is not None or new.error is not None or \
            (old.count, old.content_hash) == (new.count, new.content_hash):
        return
    what = (f"{old.count} samples before, {new.count} now" if old.count != new.count
            else "the same number of samples with other contents")
    raise TrainingDataError(
        f"Partition {new.partition} of the {name} RDD came back different when its shard was "
        f"rebuilt ({what}): the RDD is not deterministic (random sampling without a seed, an "
        "unordered source, a nondeterministic UDF), so training cannot go on with the samples "
        "its batch plan was made for. Make the input deterministic: cache() or checkpoint() it "
        "before training, sort it, or seed its sampling." + (f" {hint}" if hint else ""))


def size_text(nbytes: int) -> str:
    """``nbytes`` for the log: MiB from 1 MiB up, KiB below."""
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.1f} KiB"


class HeldData:
    """Data held as per-partition shards in the executors' Python workers (see the module
    docstring). Subclasses implement :meth:`_build` and :meth:`_fill` and say how many
    partitions the data has.

    Args:
        float_dtype: numpy dtype string that floating features and labels are stored in.
        name: a word for the logs ("training", "validation").
        place: where executors keep the shards, "disk" or "memory"
            (:func:`sparkdl.runners.cached_rdd.shard_place`).
        ragged: the inputs that are variable-length (:mod:`sparkdl.data.ragged`).
    """

    rebuild_hint = ""
    """Added to the error for a rebuilt shard that differs (what to do about it here)."""
    source = "the input"
    """Where rebuilt shards come from, for the log."""

    def __init__(self, float_dtype: str, name: str, place: str = "disk",
                 ragged: tuple[int, ...] = ()) -> None:
        self.float_dtype = float_dtype
        self.name = name
        self.place = place
        self.ragged = tuple(ragged)
        self.data_key = new_key(name)
        self.summaries: list[ShardSummary] = []
        self.shards_rebuilt = 0
        self.placement_misses = 0

    @property
    def builder(self) -> ShardBuildTask:
        """The build function of this data's shards (carries the driver's live runs)."""
        return ShardBuildTask(self.data_key, self.float_dtype, self.place, self.ragged,
                              live=live_runs())

    @property
    def num_partitions(self) -> int:   # pragma: no cover - abstract
        raise NotImplementedError

    def _build(self) -> list[ShardSummary]:   # pragma: no cover - abstract
        """One job turning every partition into a shard where its task runs, and keeping the
        index that steers later tasks there; the partitions' summaries."""
        raise NotImplementedError

    def _fill(self, partitions: list[int], task: Any, resources: Any
              ) -> dict[int, tuple[ShardSummary, Any]]:   # pragma: no cover - abstract
        """One job over exactly ``partitions`` of the input: each task builds its shard where it
        runs and computes ``task.compute(partition, shard)``; ``(summary, result)`` by
        partition."""
        raise NotImplementedError

    def build(self) -> list[ShardSummary]:
        """Convert every partition into a shard on its executor (one job); raise the first
        permanent sparkdl error a build task reported
        (:func:`sparkdl.errors.raise_reported`)."""
        self.summaries = sorted(self._build(), key=lambda s: s.partition)
        raise_reported(self.summaries, f"building the {self.name} shards")
        log.info("%s data: %d samples in %d partitions held as shards on the executors (%s)",
                 self.name, sum(s.count for s in self.summaries), len(self.summaries),
                 size_text(self.held_bytes))
        return self.summaries

    @property
    def held_bytes(self) -> int:
        """The bytes of the shards' arrays as the executors hold them, each shard once."""
        return sum(s.nbytes for s in self.summaries)

    def record_holder(self, partition: int, summary: ShardSummary) -> None:
        """A fill built ``partition``'s shard where its task ran (nothing to note here)."""

    def rebuild(self, reason: str) -> None:
        """Build all shards again (``reason`` goes to the log) and check that the input gave
        back the same samples: a nondeterministic input would silently train on other data."""
        log.warning("%s shards must be rebuilt: %s; rebuilding all %d of them from %s",
                    self.name, reason, self.num_partitions, self.source)
        before = self.summaries
        self.build()
        self.shards_rebuilt += len(self.summaries)
        if len(before) != len(self.summaries):
            raise TrainingDataError(
                f"The {self.name} data had {len(before)} partitions and has "
                f"{len(self.summaries)} after the rebuild." + (f" {self.rebuild_hint}"
                                                               if self.rebuild_hint else ""))
        for old, new in zip(before, self.summaries):
            check_unchanged(self.name, old, new, self.rebuild_hint)

    def fill(self, partitions: list[int], task: Any, resources: Any = None) -> dict[int, Any]:
        """``task.compute`` on ``partitions`` after building their shards where the fill tasks
        run (``resources``: the stage's ResourceProfile, if any); the results by partition,
        once each rebuilt shard has been checked against the first build."""
        wanted = sorted(partitions)
        rows = self._fill(wanted, task, resources)
        self.accept_fills(wanted, {p: summary for p, (summary, _) in rows.items()})
        return {p: result for p, (_, result) in rows.items()}

    def accept_fills(self, wanted: list[int], summaries: dict[int, ShardSummary]) -> None:
        """The shards a fill job built for the partitions ``wanted`` (their ``summaries``, by
        partition) checked against the first build and counted, their executors noted as
        holders; the first permanent error a fill task reported raised."""
        self.placement_misses += len(wanted)
        self.shards_rebuilt += len(summaries)
        raise_reported([summary for _, summary in sorted(summaries.items())],
                       f"filling the {self.name} shards {wanted}")
        if sorted(summaries) != wanted:
            raise SparkdlError(f"filling the {self.name} shards {wanted} built the shards of "
                               f"partitions {sorted(summaries)}")
        for p, summary in sorted(summaries.items()):
            check_unchanged(self.name, self.summaries[p], summary, self.rebuild_hint)
            if summary.error is not None:
                raise TrainingDataError(f"Partition {p} of the {self.name} data failed when its "
                                        f"shard was rebuilt: {summary.error}")
        for p, summary in sorted(summaries.items()):
            self.record_holder(p, summary)
        log.info("%s partitions %s ran where their shard was not; built those %d shards where "
                 "their tasks ran (%d shards rebuilt so far)", self.name, wanted,
                 len(summaries), self.shards_rebuilt)


def not_found(metrics: PartitionMetrics, data: DataHandle) -> bool:
    """Whether a validation task found no shard of its partition where it ran (not one that
    met a permanent error: that is raised, never filled)."""
    return (metrics.sums is None and metrics.fatal is None
            and data.summaries[metrics.partition].count > 0)


Filled = dict[int, Any]
"""``{partition: (vector or None, TaskReport)}`` computed by fill jobs for this very step."""


def complete_misses(result: Any, fill: Callable[[list[int]], Filled],
                    complete: Callable[[Any, Filled], Any], num_partitions: int) -> Any:
    """``result`` (an :class:`~sparkdl.transport.allreduce.AllReduceResult`) with every
    partition whose task found no shard filled: ``fill(partitions)`` computes their step where
    their shards are built, ``complete(result, filled)`` finishes the iteration with those
    vectors (summed in partition order). A completion that runs tasks again can meet new misses;
    each round fills at least one partition for good, so this ends within ``num_partitions``
    rounds."""
    filled: Filled = {}
    for _ in range(num_partitions + 1):
        missing = [p for p in result.missing_partitions if p not in filled]
        if not missing:
            if result.missing_partitions:      # found missing again, already filled
                result = complete(result, filled)
                continue
            return result
        attempts = {r.partition: r.attempt for r in result.reports}
        for p, (vector, report) in fill(missing).items():
            report.attempt = max(report.attempt, attempts.get(p, 0))   # for the log
            filled[p] = (vector, report)
        result = complete(result, filled)
    raise SparkdlError(f"partitions {result.missing_partitions} still found no shard after "
                       f"{num_partitions + 1} rounds of fills")
