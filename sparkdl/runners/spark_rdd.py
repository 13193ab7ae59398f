"""The loop's jobs as RDD jobs on a classic SparkContext (the first :class:`IterationRunner`).

* Data: each input RDD becomes shards on the executors plus a tiny locally checkpointed index
  RDD whose blocks sit where the shards are (:class:`sparkdl.runners.cached_rdd.CachedData`).
* The model: broadcast once per run (a cloudpickled :class:`ReplicaSpec`, its weights out of
  band: :mod:`sparkdl.transport.tensor_buffers`); each Python worker keeps
  a replica (:mod:`sparkdl.executor.replicas`).
* One iteration: the weights are broadcast (whole, or as the rows and rest that changed since the
  last iteration: :mod:`sparkdl.transport.weight_refresh`), the index RDD's tasks run
  :class:`sparkdl.executor.tasks.GradientTask`, and the shuffle or driver AllReduce
  (:mod:`sparkdl.transport.allreduce`) sums their vectors in partition order.

Example::

    runner = SparkRddRunner(sc)
    train = runner.load(rdd, "training", "float32")
    runner.start(ReplicaSpec(net, loss, "mean"), ParamLayout(net), RunnerOptions(), train)
    result = runner.gradients(train, step, weights)
    runner.close()
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..executor.live_runs import live_runs, new_key, release_key
from ..spark_settings import (is_local_master, shard_replicas, spark_flag, spark_setting,
                              speculation_never_fires)
from .cached_rdd import (CachedData, clean_workers, lost_data_reason, memory_kill_reason,
                         shard_place)
from .held_data import complete_misses, not_found
from .round_broadcasts import RoundBroadcasts
from .task_resources import check_gpu_scheduling, gpu_task_profile, schedules_gpus, task_cores
from .interface import (GradientRunner, HopRunner, PartitionMetrics, RoundEntry, RoundRunner,
                        RunnerOptions)
from ..executor.replicas import ReplicaSpec
from ..executor.step import StepSpec
from ..executor.hop_task import HopPartitionResult, HopSpec, HopTask
from ..executor.tasks import EvaluationTask, GradientTask, PassGradientTask
from ..metrics import ValidationMetric
from ..transport.allreduce import (AllReduceResult, ShuffleAllReduce, make_allreduce,
                                  make_pass_allreduce, with_resources)
from ..transport.codecs import make_pass_codec
from ..transport.pass_results import pass_table_rows, split_pass_result
from ..transport.flat_layout import ParamLayout
from ..transport.broadcast_bundle import BroadcastBundle
from ..transport.python_jobs import PythonJobs
from ..transport.tensor_buffers import dumps_out_of_band
from .driver_health import DriverHealth, driver_job_share
from ..transport.weight_refresh import RefreshPublisher, StateVersion

__all__ = ["SparkRddRunner"]

log = logging.getLogger(__name__)


def _held_pieces(sc: Any, layouts: Sequence[ParamLayout]) -> int:
    """The broadcast pieces of these fits' weights the driver's block store may hold while
    their sums arrive: this iteration's and the last's (none on a local master, where large
    values are files the tasks read)."""
    if PythonJobs.of(sc).local_dir is not None:
        return 0
    return 2 * sum(layout.state_bytes for layout in layouts)


class SparkRddRunner(GradientRunner, HopRunner, RoundRunner):
    """RDD + broadcast + AllReduce jobs on ``sc`` (see the module docstring)."""

    def __init__(self, sc: Any) -> None:
        self.spark_context = sc
        self._held: list[CachedData] = []
        self._fits: dict[int, _Fit] = {}
        self._passes: dict[tuple[int, ...], Any] = {}
        self._default: int | None = None
        self._speculation_checked = False
        self._options = RunnerOptions()
        self._resources: Any = None
        self._broadcast: Any = None
        """What the fits' weight refreshes broadcast with: one broadcast per value, or during a
        pass's iteration a :class:`BroadcastBundle` (one broadcast for every fit's values)."""
        self._record_bytes: int | None = None     # spark.sparkdl.maxRecordBytes, at the first fit
        self._memory_deaths: set[str] = set()   # executors already named as out of memory
        self._closed: list[str] = []      # the replicas' keys of fits closed before the runner
        self._rounds = RoundBroadcasts(sc)
        self._health = DriverHealth(sc)

    def _flag(self, key: str, default: bool) -> bool:
        return spark_flag(self.spark_context, key, default)

    def task_cores(self) -> int:
        return task_cores(self.spark_context)

    def schedules_gpus(self) -> bool:
        return schedules_gpus(self.spark_context)

    def check_device(self, device: str) -> None:
        check_gpu_scheduling(self.spark_context, device)

    def load(self, data: Any, name: str, float_dtype: str,
             ragged: tuple[int, ...] = ()) -> CachedData:
        key = "spark.io.encryption.enabled"
        place = shard_place({key: spark_setting(self.spark_context, key, "false")})
        if place == "memory":
            log.info("spark.io.encryption.enabled: the %s shards stay in the Python workers' "
                     "memory (nothing is written to the executors' disks)", name)
        replicas = 1
        if name == "training":
            replicas = shard_replicas(lambda k: spark_setting(self.spark_context, k))
            if replicas > 1 and is_local_master(self.spark_context.master):
                log.warning("spark.sparkdl.shardReplicas=%d has no effect on a local master "
                            "(one executor holds every shard)", replicas)
                replicas = 1
        cached = CachedData(data, float_dtype, name, place, ragged, replicas)
        self._held.append(cached)
        cached.build()
        if name == "training" and not self._speculation_checked:
            self._speculation_checked = True
            why = speculation_never_fires(lambda k: spark_setting(self.spark_context, k),
                                          self.spark_context.master, cached.num_partitions)
            if why is not None:
                log.warning("spark.speculation is true, but no copy of a slow training task "
                            "can ever start: %s", why)
        return cached

    def start(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
              train: CachedData) -> str:
        fit, how = self.add_fit(spec, layout, options, train)
        if self._default is None:
            self._default = fit
        return how

    def add_fit(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
                train: CachedData) -> tuple[int, str]:
        """Ship one more fit's model to the tasks (its own replicas' key, spec broadcast and
        weight refresh); returns its number and how its vectors are summed alone. The fits of
        one runner share ``options`` (the first fit's are kept) but ``compression``, which is
        each fit's own."""
        if not self._fits:
            self._health.watch()
            self._options = options
            self._resources = gpu_task_profile(self.spark_context, options.device,
                                               self.task_cores())
            # the weights every iteration: the record budget read once, not per broadcast
            self._record_bytes = PythonJobs.of(self.spark_context).record_bytes()
            self._broadcast = self._weights_broadcast()
        jobs = PythonJobs.of(self.spark_context)
        allreduce = make_allreduce(layout, options.allreduce, train.num_partitions,
                                   options.num_blocks, options.compression,
                                   driver_job_share(self.spark_context,
                                                    _held_pieces(self.spark_context, [layout])),
                                   jobs.record_bytes())
        publisher = RefreshPublisher(
            lambda value: self._broadcast(value), layout.fingerprint,
            deltas=self._flag("spark.sparkdl.rowDeltas", True),
            verify=self._flag("spark.sparkdl.verifyReplicas", False))
        number = max(self._fits, default=-1) + 1
        # the weights out of band: no copy of them here, one in the worker that builds a replica
        spec_bc = PythonJobs.of(self.spark_context).broadcast(dumps_out_of_band(spec))
        self._fits[number] = _Fit(new_key("run"), spec_bc, layout, allreduce, publisher)
        return number, (f"{type(allreduce).__name__} all-reduce of {layout.size} values"
                        + (f" (gradients in {options.compression})"
                           if options.compression else ""))

    def gradients(self, data: CachedData, step: StepSpec, weights: StateVersion
                  ) -> AllReduceResult:
        assert self._default is not None
        return self.gradients_together(data, [(self._default, step, weights)])[0]

    def _weights_broadcast(self) -> Any:
        """A broadcast of the weights: ``PythonJobs.broadcast`` with the record budget the
        runner read at its first fit (no py4j round trips for it each iteration)."""
        return functools.partial(PythonJobs.of(self.spark_context).broadcast,
                                 record_bytes=self._record_bytes)

    def gradients_together(self, data: CachedData,
                           entries: Sequence[tuple[int, StepSpec, StateVersion]]
                           ) -> list[AllReduceResult]:
        """One job for the iteration of every fit in ``entries`` (``(fit, step, weights)``):
        each fit's vector summed in partition order, exactly as its own job would (one fit
        alone: its own job; :mod:`sparkdl.engine.fit_set`)."""
        assert data.index_rdd is not None and entries
        t0 = time.perf_counter()
        live = live_runs()
        tasks, refreshes = [], []
        broadcast = self._weights_broadcast()
        bundle = BroadcastBundle(broadcast) if len(entries) > 1 else None
        self._broadcast = bundle if bundle is not None else broadcast
        try:        # the fits' new weights (full copies, row deltas): one broadcast for all
            for number, step, weights in entries:
                fit = self._fits[number]
                refreshes.append(fit.publisher.publish(weights))
                tasks.append(GradientTask(fit.run_key, data.data_key, step, fit.spec_bc,
                                          refreshes[-1], live=live))
            if bundle is not None:
                bundle.flush()
        finally:
            self._broadcast = broadcast
        broadcast_s = time.perf_counter() - t0
        results = self._summed([number for number, _, _ in entries], tasks, data, live,
                               broadcast_s)
        for number, _, _ in entries:
            self._fits[number].publisher.settle()
        for (_, step, weights), refresh, one in zip(entries, refreshes, results):
            full = sorted(r.partition for r in one.reports if r.full_read)
            if full and weights.version > refresh.full_version:
                log.info("iteration %d: the tasks of partitions %s read the full weights of "
                         "version %d and %d row deltas (a new, restarted or evicted Python "
                         "worker)", step.iteration + 1, full, refresh.full_version,
                         len(refresh.deltas))
        return results

    def _pass_allreduce(self, numbers: list[int], sizes: list[int], data: CachedData) -> Any:
        """The AllReduce of these fits' vectors one after another (kept while the set of fits
        stays the same)."""
        key = tuple(numbers)
        if key not in self._passes:
            options = self._options
            fits = [self._fits[number] for number in numbers]
            layouts = [fit.layout for fit in fits]
            dtype = layouts[0].numpy_dtype
            codec = make_pass_codec([fit.allreduce.codec for fit in fits], sizes, dtype)
            self._passes = {key: make_pass_allreduce(sum(sizes), dtype, options.allreduce,
                                                     data.num_partitions, options.num_blocks,
                                                     codec, pass_table_rows(layouts),
                                                     driver_job_share(
                                                         self.spark_context,
                                                         _held_pieces(self.spark_context, layouts)),
                                                     PythonJobs.of(self.spark_context)
                                                     .record_bytes())}
        return self._passes[key]

    def evaluate(self, data: CachedData, weights: np.ndarray,
                 metrics: Sequence[ValidationMetric], batch_size: int, fit: int | None = None
                 ) -> list[PartitionMetrics]:
        assert data.index_rdd is not None
        one = self._fits[self._default if fit is None else fit]
        weights_bc = PythonJobs.of(self.spark_context).broadcast(weights)
        try:
            task = EvaluationTask(one.run_key, data.data_key, one.spec_bc, weights_bc,
                                  list(metrics), batch_size, self._options.device,
                                  self._options.precision, live=live_runs())
            rows = {row.partition: row for row in with_resources(
                data.index_rdd.mapPartitionsWithIndex(task), self._resources).collect()}
            missing = [p for p, row in rows.items() if not_found(row, data)]
            if missing:
                rows.update(data.fill(missing, task, self._resources))
        finally:
            weights_bc.destroy(blocking=False)
        return [rows[p] for p in sorted(rows)]

    def hop(self, data: CachedData, bundles: dict[int, bytes],
            assignments: dict[int, list[tuple[int, HopSpec]]]) -> dict[int, HopPartitionResult]:
        """One sub-epoch of model hopping (:mod:`sparkdl.engine.strategies.hop.jobs`): the models'
        bundles in one broadcast, each partition's task training the models assigned to it on
        its shard (a partition whose task ran where its shard is not is filled, as a gradient
        job's); the results by partition."""
        assert data.index_rdd is not None
        bundles_bc = PythonJobs.of(self.spark_context).broadcast(bundles)
        try:
            task = HopTask(data.data_key, bundles_bc, assignments, live=live_runs())
            rows = {row.partition: row for row in with_resources(
                data.index_rdd.mapPartitionsWithIndex(task), self._resources).collect()}
            missing = sorted(p for p, row in rows.items() if row.missing_shard)
            if missing:
                rows.update(data.fill(missing, task, self._resources))
        finally:
            bundles_bc.destroy(blocking=False)
        return rows

    def rounds_together(self, data: CachedData, entries: Sequence[RoundEntry]
                        ) -> list[AllReduceResult]:
        """One job for a local round of every fit in ``entries``: each partition's
        :class:`~sparkdl.executor.round_task.RoundTask` where its shard is
        (:mod:`.round_broadcasts`: what it is shipped), the deltas summed as a gradient job's."""
        assert data.index_rdd is not None and entries
        t0 = time.perf_counter()
        live = live_runs()
        tasks, held = self._rounds.tasks(data.data_key, entries, live,
                                         [self._fits[entry.fit].run_key for entry in entries])
        try:
            return self._summed([entry.fit for entry in entries], tasks, data, live,
                                time.perf_counter() - t0)
        finally:
            self._rounds.drop(held)

    def _summed(self, numbers: list[int], tasks: list[Any], data: CachedData, live: Any,
                broadcast_s: float) -> list[AllReduceResult]:
        """One job of the fits ``numbers``' ``tasks`` (one per fit: a gradient or a round
        task), their vectors summed in partition order by the fit's AllReduce (several: the
        pass's), partitions whose shard was missing filled; each fit's result."""
        fits = [self._fits[number] for number in numbers]
        if len(fits) == 1:
            task: Any = tasks[0]
            allreduce = fits[0].allreduce
        else:
            sizes = [fit.layout.size for fit in fits]
            task = PassGradientTask(data.data_key, tasks, sizes,
                                    fits[0].layout.numpy_dtype.str, live=live)
            allreduce = self._pass_allreduce(numbers, sizes, data)
        try:
            result = allreduce.run(data.iteration_rdd(), task, self._resources)
            if isinstance(allreduce, ShuffleAllReduce):     # fills through its own blocks
                result = data.complete_in_blocks(result, task, allreduce, self._resources)
            else:
                result = complete_misses(
                    result, lambda missing: data.fill(missing, task, self._resources),
                    allreduce.complete, data.num_partitions)
        finally:
            allreduce.settle()          # the shuffle's map files, once the result is final
        data.after_iteration(result.reports)
        result.broadcast_s = broadcast_s
        return [result] if len(fits) == 1 else split_pass_result(result, sizes)

    def lost_data_reason(self, exc: BaseException) -> str | None:
        return lost_data_reason(exc)

    def memory_kill_reason(self, exc: BaseException) -> str | None:
        return memory_kill_reason(exc, self.spark_context, self._memory_deaths)

    def driver_failure(self, exc: BaseException) -> str | None:
        """Why ``exc`` is the driver's memory, or None (:mod:`.driver_health`)."""
        return self._health.failure(exc)

    def rebuild(self, data: CachedData, reason: str) -> None:
        data.rebuild(reason)

    def close_fit(self, fit: int) -> None:
        """Release one fit's broadcasts and replicas (its data stays with the runner; the
        workers' cleanup job runs once, in :meth:`close`)."""
        self._rounds.release(fit)
        one = self._fits.pop(fit, None)
        if one is None:
            return
        self._passes = {}
        one.release()
        release_key(one.run_key)      # the next task in a worker evicts its replicas; the
        self._closed.append(one.run_key)   # cleanup job of close() covers the idle workers

    def close(self) -> None:
        try:
            self._release_all()
        finally:             # watched to the end: the cleanup's jobs may wait on the driver too
            self._health.stop()

    def _release_all(self) -> None:
        fits = list(self._fits.values())
        self._rounds.close()
        self._fits, self._passes = {}, {}
        for one in fits:
            one.release()
        for data in self._held:
            data.release()
        keys = ([one.run_key for one in fits] + self._closed
                + [d.data_key for d in self._held])
        self._closed = []
        for key in keys:     # later tasks of any run evict what the cleanup job misses
            release_key(key)
        if keys:             # nothing was shipped (a fit refused before any job): no job
            clean_workers(self.spark_context, keys)
        self._held = []


@dataclass
class _Fit:
    """One fit of a runner: its replicas' key, its spec's broadcast, its layout, the AllReduce
    of its vectors alone and its weights' refresh."""

    run_key: str
    spec_bc: Any
    layout: ParamLayout
    allreduce: Any
    publisher: RefreshPublisher

    def release(self) -> None:
        """Destroy the fit's weight broadcasts and its spec's (saying how the weights went)."""
        log.info("the weights travelled as %s", self.publisher.summary())
        self.publisher.close()
        self.spec_bc.destroy(blocking=False)
