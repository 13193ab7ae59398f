"""The loop's jobs as RDD jobs on a classic SparkContext (the first :class:`IterationRunner`).

* Data: each input RDD becomes shards on the executors plus a tiny locally checkpointed index
  RDD whose blocks sit where the shards are (:class:`sparkdl.runners.cached_rdd.CachedData`).
* The model: broadcast once per run (cloudpickled :class:`ReplicaSpec`); each Python worker keeps
  a replica (:mod:`sparkdl.executor.replicas`).
* One iteration: the weights are broadcast, the index RDD's tasks run
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
import uuid
from typing import Any, Sequence

import numpy as np

from .cached_rdd import CachedData, clean_workers, lost_data_reason
from .interface import PartitionMetrics, RunnerOptions
from ..executor.replicas import ReplicaSpec
from ..executor.step import StepSpec
from ..executor.tasks import EvaluationTask, GradientTask
from ..metrics import ValidationMetric
from ..transport.allreduce import AllReduceResult, make_allreduce
from ..transport.flat_layout import ParamLayout

__all__ = ["SparkRddRunner"]

log = logging.getLogger(__name__)


class SparkRddRunner:
    """RDD + broadcast + AllReduce jobs on ``sc`` (see the module docstring)."""

    def __init__(self, sc: Any) -> None:
        self.spark_context = sc
        self.run_key = f"run-{uuid.uuid4().hex[:12]}"
        self._held: list[CachedData] = []
        self._spec_bc: Any = None
        self._allreduce: Any = None

    def load(self, data: Any, name: str, float_dtype: str) -> CachedData:
        cached = CachedData(data, float_dtype, name)
        self._held.append(cached)
        cached.build()
        return cached

    def start(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
              train: CachedData) -> str:
        from pyspark import cloudpickle

        self._spec_bc = self.spark_context.broadcast(cloudpickle.dumps(spec))
        self._allreduce = make_allreduce(layout, options.allreduce, train.num_partitions,
                                         options.num_blocks, options.compression)
        return (f"{type(self._allreduce).__name__} all-reduce of {layout.size} values"
                + (f" (gradients in {options.compression})" if options.compression else ""))

    def gradients(self, data: CachedData, step: StepSpec, weights: np.ndarray
                  ) -> AllReduceResult:
        assert data.index_rdd is not None and self._allreduce is not None
        t0 = time.perf_counter()
        weights_bc = self.spark_context.broadcast(weights)
        broadcast_s = time.perf_counter() - t0
        try:
            task = GradientTask(self.run_key, data.data_key, step, self._spec_bc, weights_bc)
            result = self._allreduce.run(data.index_rdd, task)
        finally:
            weights_bc.destroy(blocking=False)
        result.broadcast_s = broadcast_s
        return result

    def evaluate(self, data: CachedData, weights: np.ndarray,
                 metrics: Sequence[ValidationMetric], batch_size: int
                 ) -> list[PartitionMetrics]:
        assert data.index_rdd is not None
        weights_bc = self.spark_context.broadcast(weights)
        try:
            task = EvaluationTask(self.run_key, data.data_key, self._spec_bc, weights_bc,
                                  list(metrics), batch_size)
            rows = data.index_rdd.mapPartitionsWithIndex(task).collect()
        finally:
            weights_bc.destroy(blocking=False)
        return [PartitionMetrics(p, sums, n) for p, sums, n in sorted(rows, key=lambda r: r[0])]

    def lost_data_reason(self, exc: BaseException) -> str | None:
        return lost_data_reason(exc)

    def rebuild(self, data: CachedData, reason: str) -> None:
        data.rebuild(reason)

    def close(self) -> None:
        if self._spec_bc is not None:
            self._spec_bc.destroy(blocking=False)
            self._spec_bc = None
        for data in self._held:
            data.release()
        clean_workers(self.spark_context, [self.run_key] + [d.data_key for d in self._held])
        self._held = []
