"""The loop's jobs as RDD jobs on a classic SparkContext (the first :class:`IterationRunner`).

* Data: each input RDD becomes shards on the executors plus a tiny locally checkpointed index
  RDD whose blocks sit where the shards are (:class:`sparkdl.runners.cached_rdd.CachedData`).
* The model: broadcast once per run (cloudpickled :class:`ReplicaSpec`); each Python worker keeps
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

import logging
import time
from typing import Any, Sequence

import numpy as np

from ..executor.live_runs import live_runs, new_key, release_key
from .cached_rdd import (CachedData, clean_workers, lost_data_reason, memory_kill_reason,
                         shard_place)
from .held_data import complete_misses, not_found
from .interface import PartitionMetrics, RunnerOptions
from ..executor.replicas import ReplicaSpec
from ..executor.step import StepSpec
from ..executor.tasks import EvaluationTask, GradientTask
from ..metrics import ValidationMetric
from ..errors import InvalidArgumentError
from ..transport.allreduce import (AllReduceResult, make_allreduce,
                                  with_resources)
from ..transport.flat_layout import ParamLayout
from ..transport.python_jobs import PythonJobs
from ..transport.weight_refresh import RefreshPublisher, StateVersion

__all__ = ["SparkRddRunner"]

log = logging.getLogger(__name__)


class SparkRddRunner:
    """RDD + broadcast + AllReduce jobs on ``sc`` (see the module docstring)."""

    def __init__(self, sc: Any) -> None:
        self.spark_context = sc
        self.run_key = new_key("run")
        self._held: list[CachedData] = []
        self._spec_bc: Any = None
        self._allreduce: Any = None
        self._options = RunnerOptions()
        self._resources: Any = None
        self._publisher: RefreshPublisher | None = None

    def _flag(self, key: str, default: bool) -> bool:
        """A boolean setting: the thread's local property (``sc.setLocalProperty``), else the
        Spark conf, else ``default``."""
        value = (self.spark_context.getLocalProperty(key)
                 or self.spark_context.getConf().get(key, "") or "").strip().lower()
        return default if not value else value in ("true", "1", "yes")

    def _conf(self, key: str) -> float:
        value = self.spark_context.getConf().get(key, "0") or "0"
        try:
            return float(value)
        except ValueError:
            return 0.0

    def _local_master(self) -> bool:
        master = self.spark_context.master
        return master == "local" or master.startswith("local[")

    def task_cores(self) -> int:
        return max(1, int(self._conf("spark.task.cpus") or 1))

    def schedules_gpus(self) -> bool:
        return not self._local_master() and self._conf("spark.executor.resource.gpu.amount") > 0

    def check_device(self, device: str) -> None:
        if device != "cuda":
            return
        if self._local_master() or self._conf("spark.executor.resource.gpu.amount") <= 0:
            raise InvalidArgumentError(
                "device='cuda' needs GPUs scheduled to the tasks, and this cluster schedules "
                f"none (master {self.spark_context.master}): set "
                "spark.executor.resource.gpu.amount (with "
                "spark.executor.resource.gpu.discoveryScript or your cluster manager's GPU "
                "settings) and optionally spark.task.resource.gpu.amount; local[N] masters never "
                "schedule GPUs (use local-cluster, standalone, YARN or Kubernetes). "
                "device='auto' uses a GPU where there is one and the CPU otherwise.")

    def _task_resources(self, device: str) -> Any:
        """A task resource profile asking for one GPU per task, when executors have GPUs that
        tasks do not ask for by default (so only sparkdl's stages hold them); else None."""
        if device == "cpu" or self._local_master():
            return None
        if self._conf("spark.executor.resource.gpu.amount") <= 0 or \
                self._conf("spark.task.resource.gpu.amount") > 0:
            return None
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        requests = TaskResourceRequests().cpus(self.task_cores()).resource("gpu", 1.0)
        log.info("the gradient and validation stages ask for 1 GPU per task through a task "
                 "resource profile (spark.task.resource.gpu.amount is not set)")
        return ResourceProfileBuilder().require(requests).build

    def load(self, data: Any, name: str, float_dtype: str,
             ragged: tuple[int, ...] = ()) -> CachedData:
        place = shard_place(self.spark_context.getConf())
        if place == "memory":
            log.info("spark.io.encryption.enabled: the %s shards stay in the Python workers' "
                     "memory (nothing is written to the executors' disks)", name)
        cached = CachedData(data, float_dtype, name, place, ragged)
        self._held.append(cached)
        cached.build()
        return cached

    def start(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
              train: CachedData) -> str:
        from pyspark import cloudpickle

        self._spec_bc = self.spark_context.broadcast(cloudpickle.dumps(spec))
        self._options = options
        self._resources = self._task_resources(options.device)
        self._allreduce = make_allreduce(layout, options.allreduce, train.num_partitions,
                                         options.num_blocks, options.compression)
        self._publisher = RefreshPublisher(
            PythonJobs.of(self.spark_context).broadcast, layout.fingerprint,
            deltas=self._flag("spark.sparkdl.rowDeltas", True),
            verify=self._flag("spark.sparkdl.verifyReplicas", False))
        return (f"{type(self._allreduce).__name__} all-reduce of {layout.size} values"
                + (f" (gradients in {options.compression})" if options.compression else ""))

    def gradients(self, data: CachedData, step: StepSpec, weights: StateVersion
                  ) -> AllReduceResult:
        assert data.index_rdd is not None and self._allreduce is not None
        assert self._publisher is not None
        t0 = time.perf_counter()
        refresh = self._publisher.publish(weights)
        broadcast_s = time.perf_counter() - t0
        task = GradientTask(self.run_key, data.data_key, step, self._spec_bc, refresh,
                            live=live_runs())
        result = self._allreduce.run(data.index_rdd, task, self._resources)
        result = complete_misses(
            result, lambda missing: data.fill(missing, task, self._resources),
            self._allreduce.complete,
            data.num_partitions)
        self._publisher.settle()
        result.broadcast_s = broadcast_s
        full = sorted(r.partition for r in result.reports if r.full_read)
        if full and weights.version > refresh.full_version:
            log.info("iteration %d: the tasks of partitions %s read the full weights of "
                     "version %d and %d row deltas (a new, restarted or evicted Python worker)",
                     step.iteration + 1, full, refresh.full_version, len(refresh.deltas))
        return result


    def evaluate(self, data: CachedData, weights: np.ndarray,
                 metrics: Sequence[ValidationMetric], batch_size: int
                 ) -> list[PartitionMetrics]:
        assert data.index_rdd is not None
        weights_bc = self.spark_context.broadcast(weights)
        try:
            task = EvaluationTask(self.run_key, data.data_key, self._spec_bc, weights_bc,
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

    def lost_data_reason(self, exc: BaseException) -> str | None:
        return lost_data_reason(exc)

    def memory_kill_reason(self, exc: BaseException) -> str | None:
        return memory_kill_reason(exc)

    def rebuild(self, data: CachedData, reason: str) -> None:
        data.rebuild(reason)

    def close(self) -> None:
        if self._publisher is not None:
            log.info("the weights travelled as %s", self._publisher.summary())
            self._publisher.close()
            self._publisher = None
        if self._spec_bc is not None:
            self._spec_bc.destroy(blocking=False)
            self._spec_bc = None
        for data in self._held:
            data.release()
        keys = [self.run_key] + [d.data_key for d in self._held]
        for key in keys:     # later tasks of any run evict what the cleanup job misses
            release_key(key)
        clean_workers(self.spark_context, keys)
        self._held = []
