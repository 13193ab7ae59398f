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
  and a miss never fails a run. On the shuffle AllReduce's path the fill tasks are map tasks
  whose vectors go through the AllReduce's blocks (:meth:`CachedData.complete_in_blocks`,
  :mod:`sparkdl.transport.filled_blocks`), never through the driver.
* A *lost executor*: its checkpointed blocks are lost with it and the iteration's job fails with
  Spark's "Checkpoint block ... not found"; the engine recognises that (:func:`lost_data_reason`),
  rebuilds all shards and the index with :meth:`CachedData.rebuild` and re-runs the iteration,
  which is deterministic.

Every rebuilt shard is checked against the first build (sample count and content hash): an input
RDD that does not give back the same samples is a :class:`~sparkdl.errors.TrainingDataError`.
Rebuilt shards and misses are counted (``shards_rebuilt``, ``placement_misses``) for the
training summary.

With ``replicas`` r >= 2 (``spark.sparkdl.shardReplicas``, training data only) each shard is
also built on r - 1 other executors right after the build: tasks over the cartesian product of
a :func:`~sparkdl.runners.targeted_rdd.targeted_rdd` of the partition numbers with the user's
RDD, running only its diagonal (partition p with partition p), so each replica task runs where
its replica should be (the targeted side's preference) and reads partition p's lineage there, in
one Python worker; each is a job of its own, so speculation never copies it. (The product has
P * P partitions, of which P run: a few tens of MB of partition objects on the driver at a
thousand partitions.)
Every replica must have the first build's count and content hash, or the fit stops with an
error naming the partition. Iteration jobs then run over a targeted RDD preferring each shard's
healthy holders (:mod:`sparkdl.runners.shard_placement`, which also learns which executors are
slow), not over the index RDD; replicas lost with an executor are built again on others.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

from pyspark import RDD, StorageLevel

from ..errors import SparkdlError, TrainingDataError, exception_text, raise_reported
from ..executor.shard_store import ShardSummary
from ..executor.replica_build import ReplicaBuildTask, as_collected
from ..executor.tasks import CleanupTask, FillMapTask, FillTask
from ..transport.allreduce import AllReduceResult, ShuffleAllReduce, with_resources
from ..transport.python_jobs import JobRdd, PythonJobs
from .held_data import HeldData, check_unchanged, size_text
from .shard_placement import ShardPlacement, executor_id
from .slow_executors import TaskTiming
from .targeted_rdd import single_task_jobs, targeted_rdd

__all__ = ["CachedData", "check_unchanged", "clean_workers", "driver_memory_reason",
           "lost_data_reason", "memory_kill_reason", "partition_subset",
           "shard_place"]

_LOST_DATA_MARKERS = ("Checkpoint block", "ExecutorLostFailure", "FetchFailed")
_MEMORY_KILL_MARKERS = ("exceeding memory limits", "exceeding physical memory",
                        "exceeding virtual memory", "OOMKilled", "possible container OOM",
                        "java.lang.OutOfMemoryError", "exited with code 52",
                        "exit code 52")
"""How YARN, Kubernetes and the JVM say that an executor died for memory (52: the exit code
of an executor whose JVM ran out of heap)."""


_TASK_FAILURE_MARKERS = ("Lost task", "stage failure", "ExecutorLostFailure", "executor ")


def driver_memory_reason(exc: BaseException | str) -> str | None:
    """The line saying that the driver's own JVM ran out of heap, or None: a
    ``java.lang.OutOfMemoryError`` thrown by the driver's call itself (the first Java exception
    of a py4j error), not one a task or an executor reported. ``exc``: the error, or its text."""
    text = exc if isinstance(exc, str) else exception_text(exc)
    lines = [line.strip(" :") for line in text.splitlines() if line.strip()]
    first_java = next((line for line in lines if "Exception" in line or "Error:" in line
                       or line.startswith("java.")), "")
    if "java.lang.OutOfMemoryError" not in first_java:
        return None
    if any(marker in text for marker in _TASK_FAILURE_MARKERS):
        return None
    return first_java[:300]


def memory_kill_reason(exc: BaseException, sc: Any = None,
                       seen: set[str] | None = None) -> str | None:
    """The line saying that an executor was killed for exceeding its memory, or None (a driver
    out of heap is not one: :func:`driver_memory_reason`). With ``sc``: for a job that lost
    executor-held data without saying why, an executor Spark removed for memory meanwhile
    (:func:`executors_removed_for_memory`, not naming those in ``seen`` again)."""
    text = exception_text(exc)      # read once: a Java exception's comes from the JVM
    if driver_memory_reason(text) is not None:
        return None
    for line in text.splitlines():
        if any(marker in line for marker in _MEMORY_KILL_MARKERS):
            return line.strip(" :")[:300]
    if sc is not None and lost_data_reason(text) is not None:
        return executors_removed_for_memory(sc, seen if seen is not None else set())
    return None


_WORKER_CRASH_MARKERS = ("Python worker exited unexpectedly",)
"""How Spark says that a task's Python worker died without a Python error (killed)."""


def worker_crash_reason(exc: BaseException) -> str | None:
    """The line saying that a task's Python worker died without raising (in practice killed
    for memory: by the operating system, or by a container limit), or None."""
    for line in exception_text(exc).splitlines():
        if any(marker in line for marker in _WORKER_CRASH_MARKERS):
            return line.strip(" :")[:300]
    return None


def executors_removed_for_memory(sc: Any, seen: set[str]) -> str | None:
    """Which executor Spark removed for memory (its JVM's exit code 52, a memory kill a cluster
    manager reported), from the application's status store, or None; those it names are added
    to ``seen`` and not named again. A job whose executors died of it often says only that a
    block is gone (the retried task finds no checkpoint block), not why."""
    try:
        executors = sc._jsc.sc().statusStore().executorList(False)
        found = []
        for i in range(executors.size()):
            summary = executors.apply(i)
            reason = summary.removeReason()
            text = str(reason.get()) if reason.isDefined() else ""
            if str(summary.id()) not in seen and any(m in text for m in _MEMORY_KILL_MARKERS):
                seen.add(str(summary.id()))
                found.append(f"executor {summary.id()} was removed: {text}")
    except Exception:       # noqa: BLE001 - a diagnosis only: the job's own error stands
        return None
    if not found:
        return None
    return found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")


def lost_data_reason(exc: BaseException | str) -> str | None:
    """If a Spark job failed because executor-held data was lost (a lost executor), which a
    rebuild of the shards repairs, the line of the error (or of its text) that says so;
    otherwise None."""
    text = exc if isinstance(exc, str) else exception_text(exc)
    for line in text.splitlines():
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


def _below_python(rdd: RDD) -> tuple[RDD, Any]:
    """``rdd`` as the JVM RDD under its pipelined Python functions and those functions (a
    ``PipelinedRDD``'s ``_prev_jrdd`` and ``func``, partitions unchanged), or ``(rdd, None)``."""
    func, below = getattr(rdd, "func", None), getattr(rdd, "_prev_jrdd", None)
    if func is None or below is None or rdd._is_barrier():
        return rdd, None
    return RDD(below, rdd.ctx, rdd._prev_jrdd_deserializer), func


def partition_subset(rdd: RDD, partitions: list[int]) -> Any:
    """The JVM RDD of ``rdd``'s ``partitions`` alone (Spark's ``PartitionPruningRDD``: its
    partition ``i`` computes ``rdd``'s partition ``partitions[i]``, where that one would run),
    for ``partitions`` in ascending order."""
    jvm = rdd.ctx._jvm
    wanted = jvm.java.util.HashSet()
    for p in partitions:
        wanted.add(int(p))
    keep = jvm.scala.collection.JavaConverters.asScalaSet(wanted)   # a Scala Int => Boolean
    return jvm.org.apache.spark.rdd.PartitionPruningRDD.create(rdd._jrdd.rdd(), keep)


def check_replica(name: str, first: ShardSummary, replica: ShardSummary) -> None:
    """A replica must hold exactly the samples of the shard built first."""
    if (first.count, first.content_hash) == (replica.count, replica.content_hash):
        return
    what = (f"{first.count} samples in the first shard, {replica.count} in the replica"
            if first.count != replica.count else
            "the same number of samples with other contents")
    raise TrainingDataError(
        f"Partition {replica.partition} of the {name} data gave a replica shard that differs "
        f"from the shard built first ({what}; content hash {first.content_hash[:12]} against "
        f"{replica.content_hash[:12]}), so the replica is refused: the input RDD is not "
        "deterministic (random sampling without a seed, an unordered source, a "
        "nondeterministic UDF, files that changed). Make it deterministic (cache() or "
        "checkpoint() it before training, sort it, seed its sampling), or train without "
        "replicas (spark.sparkdl.shardReplicas=1).")


def _drop_blocks(rdd: RDD) -> None:
    """Remove a locally checkpointed RDD's blocks from the executors (not blocking).

    ``rdd.unpersist()`` would log a warning for every such RDD ("was locally checkpointed, its
    lineage has been truncated and cannot be recomputed after unpersisting"): true, and the
    point here, since the shards are dropped for good (a rebuild makes a new RDD), so the
    warning would only alarm. This is the call Spark's own ContextCleaner makes for an RDD it
    collects, which warns about nothing."""
    rdd.context._jsc.sc().unpersistRDD(rdd.id(), False)
    rdd.is_cached = False


class CachedData(HeldData):
    """An RDD of ``(features, label)`` pairs held as shards on the executors (RDD jobs;
    everything else is :class:`~sparkdl.runners.held_data.HeldData`'s).

    Args:
        rdd: the user's RDD (not modified, never unpersisted by sparkdl).
        float_dtype, name, place, ragged: as for :class:`~sparkdl.runners.held_data.HeldData`.
    """

    source = "the RDD lineage"

    def __init__(self, rdd: RDD, float_dtype: str, name: str, place: str = "disk",
                 ragged: tuple[int, ...] = (), replicas: int = 1) -> None:
        super().__init__(float_dtype, name, place, ragged)
        self.rdd = rdd
        self.index_rdd: RDD | None = None
        self.replicas = replicas
        self.placement: ShardPlacement | None = None
        self.replicas_built = 0
        self._locations: dict[str, str] = {}     # executor id -> its location, as tasks say it
        self._targeted: tuple[Any, RDD] | None = None
        self._alive_now: list[str] = []           # as of the last iteration
        self._replicated = False

    @property
    def num_partitions(self) -> int:
        return self.rdd.getNumPartitions()

    def _build(self) -> list[ShardSummary]:
        if self.index_rdd is not None:
            _drop_blocks(self.index_rdd)
        self.index_rdd = self.rdd.mapPartitionsWithIndex(self.builder)
        self.index_rdd.setName(f"sparkdl {self.name} shards {self.data_key}")
        # persist() also stops pyspark from pipelining later stages into the build function;
        # localCheckpoint() then cuts the lineage once the blocks exist.
        self.index_rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self.index_rdd.localCheckpoint()
        return self.index_rdd.collect()

    def build(self) -> list[ShardSummary]:
        summaries = super().build()
        self.placement, self._targeted, self._replicated = None, None, False
        if self.replicas > 1:
            self._place(summaries)
        return summaries

    def _alive(self) -> list[str]:
        """The executors alive now, as ``executor_<host>_<id>`` (the spelling their tasks use
        where known), in the order Spark lists them."""
        store = self.rdd.context._jsc.sc().statusStore()
        listed = store.executorList(True)
        alive = []
        for k in range(listed.size()):
            executor = listed.apply(k)
            eid = executor.id()
            if eid == "driver":
                continue
            host = executor.hostPort().rsplit(":", 1)[0]
            alive.append(self._locations.get(eid, f"executor_{host}_{eid}"))
        return alive

    def _learn(self, location: str) -> None:
        if location:
            self._locations[executor_id(location)] = location

    def _place(self, summaries: list[ShardSummary]) -> None:
        for s in summaries:
            self._learn(s.executor)
        unknown = [s.partition for s in summaries if s.count and not s.executor]
        alive = self._alive()
        if unknown or len(alive) < 2:
            log.warning("spark.sparkdl.shardReplicas=%d: %s; the %s shards are held once and "
                        "Spark places their tasks", self.replicas,
                        "fewer than two executors" if len(alive) < 2 else
                        f"the executors of partitions {unknown[:8]} are unknown (no /proc)",
                        self.name)
            return
        self.placement = ShardPlacement(self.replicas)
        self._alive_now = alive
        for s in summaries:
            if s.count:
                self.placement.hold(s.partition, s.executor)
        self._build_replicas()

    @property
    def held_bytes(self) -> int:
        """The bytes of the shards' arrays as the executors hold them, every holder counted
        (about ``replicas`` times the data)."""
        if self.placement is None:
            return super().held_bytes
        return sum(self.summaries[p].nbytes * len(where)
                   for p, where in self.placement.holders.items())

    def _holders_text(self) -> str:
        """How many executors hold each shard, and the shard bytes that makes per executor."""
        assert self.placement is not None
        counts = sorted({len(h) for p, h in self.placement.holders.items()
                         if self.summaries[p].count})
        held: dict[str, int] = {}
        for p, where in self.placement.holders.items():
            for h in where:
                held[h] = held.get(h, 0) + self.summaries[p].nbytes
        return ((" or ".join(f"{c} executors" for c in counts) or "no executor")
                + f"; {size_text(sum(held.values()))} of shards in all, at most "
                f"{size_text(max(held.values(), default=0))} on one executor, against "
                f"{size_text(sum(s.nbytes for s in self.summaries))} held once")

    def _holders_list(self) -> str:
        assert self.placement is not None
        return "; ".join(f"{p}: {', '.join(h)}" for p, h in sorted(self.placement.holders.items()))

    def _build_replicas(self) -> None:
        """Build the replicas :meth:`ShardPlacement.wanted` asks for (one job) and apply them:
        each replica checked against the shard built first (a differing one stops the fit,
        naming its partition), its executor added to the partition's holders. A job that fails
        is logged and tried again after the next iteration."""
        assert self.placement is not None
        targets = self.placement.wanted({s.partition: s.count for s in self.summaries},
                                        self._alive_now)
        if not targets:
            return
        started = time.perf_counter()
        try:
            replicas = self._replica_job(targets)
        except Exception as exc:
            if "py4j" not in type(exc).__module__ and "Py4J" not in type(exc).__name__:
                raise
            log.warning("building replicas of the %s shards failed (%s); trying again after "
                        "the next iteration", self.name,
                        exception_text(exc).strip().splitlines()[0][:300])
            return
        raise_reported(replicas, f"building replicas of the {self.name} shards")
        for replica in replicas:
            check_replica(self.name, self.summaries[replica.partition], replica)
            if replica.executor and replica.executor != targets[replica.partition]:
                log.info("the replica of %s partition %d was built on %s, not on %s (Spark's "
                         "locality wait ran out)", self.name, replica.partition,
                         replica.executor, targets[replica.partition])
            self._learn(replica.executor)
            self.placement.hold(replica.partition, replica.executor)
        self.replicas_built += len(replicas)
        self._targeted = None
        log.info("%s data: %d replica shards built%s in %.2f s; every shard is held by %s "
                 "(partition: holders, first built first: %s)", self.name, len(replicas),
                 " again" if self._replicated else "", time.perf_counter() - started,
                 self._holders_text(), self._holders_list())
        self._replicated = True

    def _replica_job(self, targets: dict[int, str]) -> list[ShardSummary]:
        """Build partition p's shard again on ``targets[p]``: the cartesian product of a
        targeted RDD (where each task should run) with the user's RDD, diagonal only, one
        single-task job per replica so that speculation never copies a replica task (a copy
        would run on a holder already, and the attempt it beat would hold its core and lose its
        Python worker)."""
        sc, width = self.rdd.context, self.num_partitions
        where = [[targets[p]] if p in targets else [] for p in range(width)]
        source, lineage = _below_python(self.rdd)
        product = targeted_rdd(sc, list(range(width)), where).cartesian(source)
        build = self.builder
        job = product.mapPartitionsWithIndex(ReplicaBuildTask(
            build.data_key, width, build.float_dtype, build.place, build.ragged, build.live,
            lineage))
        return single_task_jobs(sc, job, [p * width + p for p in sorted(targets)], as_collected,
                                lanes=[targets[p] for p in sorted(targets)])

    def iteration_rdd(self) -> RDD:
        """What an iteration's job runs over: the index RDD, or with replicas a targeted RDD
        preferring each shard's healthy holders (kept while the preferences stay the same)."""
        assert self.index_rdd is not None
        if self.placement is None:
            return self.index_rdd
        prefs = self.placement.preferences(self.num_partitions, self._alive_now)
        key = tuple(tuple(p) for p in prefs)
        if self._targeted is None or self._targeted[0] != key:
            if self._targeted is not None:
                log.info("%s tasks now go to: %s", self.name,
                         "; ".join(f"{p}: {' or '.join(w) or 'anywhere'}"
                                   for p, w in enumerate(prefs)))
            self._targeted = (key, targeted_rdd(self.rdd.context,
                                                list(range(self.num_partitions)), prefs))
        return self._targeted[1]

    def record_holder(self, partition: int, summary: ShardSummary) -> None:
        """A fill built ``partition``'s shard where its task ran: that executor holds it."""
        if self.placement is not None:
            self._learn(summary.executor)
            self.placement.hold(partition, summary.executor)

    def after_iteration(self, reports: list[Any]) -> None:
        """Learn from an iteration's tasks (where they ran, how long they took), forget the
        holders on executors that have left and build their replicas again elsewhere."""
        if self.placement is None:
            return
        for r in reports:
            self._learn(getattr(r, "executor", ""))
        timings = [TaskTiming(r.partition, r.executor, max(0.0, r.finished_at - r.started_at),
                              r.attempt) for r in reports if getattr(r, "executor", "")]
        for event in self.placement.slow.observe(timings, self.placement.holders):
            log.warning("%s tasks: %s", self.name, event)
        self._alive_now = self._alive()
        lost = self.placement.forget_lost(self._alive_now)
        if lost:
            log.warning("executors %s have left; the replicas they held are built again on "
                        "other executors", lost)
            self._targeted = None
        self._build_replicas()

    def fill_map(self, partitions: list[int], task: Any, side: Any, resources: Any) -> JobRdd:
        """The map tasks of a fill on the shuffle AllReduce's path: one over each of
        ``partitions`` of the user's RDD (cut to those partitions; its Python functions, unless
        it is cached or checkpointed, run in the fill's worker with the partitions' own
        numbers, as pyspark pipelines them), each building its shard where it
        runs and emitting ``task``'s vector through ``side``
        (:class:`~sparkdl.executor.tasks.FillMapTask`), in a stage asking for ``resources``."""
        pipelined = getattr(self.rdd, "_is_pipelinable", lambda: False)()  # not cached
        source, lineage = _below_python(self.rdd) if pipelined else (self.rdd, None)
        jobs = PythonJobs.of(self.rdd.context)
        cut = JobRdd(jobs, partition_subset(source, partitions), source._jrdd_deserializer)
        return jobs.map_partitions(
            cut, FillMapTask(FillTask(self.builder, task), list(partitions), side, lineage),
            resources)

    def complete_in_blocks(self, result: AllReduceResult, task: Any,
                           allreduce: ShuffleAllReduce, resources: Any) -> AllReduceResult:
        """``result`` (of ``allreduce.run`` with ``task``) with every partition whose task
        found no shard filled through the AllReduce's blocks (:meth:`fill_map`,
        :meth:`ShuffleAllReduce.complete`): bitwise the undisturbed sum, and no filled vector
        reaches the driver. A completion that computes lost map outputs again can meet new
        misses; each round fills at least one partition for good, so this ends within
        ``num_partitions`` rounds."""
        filled: set[int] = set()
        attempts: dict[int, int] = {}       # of the missing tasks, for the log
        for _ in range(self.num_partitions + 1):
            if not result.missing_partitions:
                return result
            missing = [p for p in result.missing_partitions if p not in filled]
            for r in result.reports:
                if r.partition not in filled:
                    attempts[r.partition] = max(r.attempt, attempts.get(r.partition, 0))
            fills = (self.fill_map(missing, task, allreduce.fill_side(), resources)
                     if missing else None)       # else found missing again: reduce again
            result, summaries = allreduce.complete(result, fills)
            if missing:
                self.accept_fills(missing, {p: s for p, s in summaries.items() if p in missing})
                filled.update(missing)
            for r in result.reports:
                if r.partition in filled:
                    r.attempt = max(r.attempt, attempts.get(r.partition, 0))
        raise SparkdlError(f"partitions {result.missing_partitions} still found no shard after "
                           f"{self.num_partitions + 1} rounds of fills")

    def _fill(self, partitions: list[int], task: Any, resources: Any
              ) -> dict[int, tuple[ShardSummary, Any]]:
        fill = FillTask(self.builder, task)
        rdd = with_resources(self.rdd.mapPartitionsWithIndex(fill), resources)
        return {summary.partition: (summary, result)
                for summary, result in self.rdd.context.runJob(rdd, as_collected, partitions)}

    def release(self) -> None:
        """Unpersist the index RDD and delete the shard files this machine can reach."""
        if self.index_rdd is None:
            return
        _drop_blocks(self.index_rdd)
        self.index_rdd = None
        self._targeted = None
        if self.placement is not None:
            log.info("%s shards' holders at the end (partition: holders): %s", self.name,
                     self._holders_list())
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
