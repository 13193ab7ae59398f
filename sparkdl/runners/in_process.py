"""The loop's jobs as plain function calls in this process: no Spark, the same arithmetic.

:class:`InProcessRunner` runs every partition's task one after another with the executor code
Spark tasks run (:func:`sparkdl.executor.step.compute_gradient` on a replica made by the same
pickle round trip a worker's is, one torch thread per task as with ``spark.task.cpus=1``) and
sums the vectors in partition order through the same codec, so a run gives bitwise the weights
of a Spark run on the same partitions. Tasks draw from their own seeded torch generator state;
the caller's torch RNG state is left as it was. Uses: fast tests of the loop, a reference for
bitwise equality, and debugging a training setup without a cluster.

Limits: the data must fit in this process; checkpoints are not available (they are written
through Spark's Hadoop file systems).

Example::

    from sparkdl.runners import LocalPartitions
    data = LocalPartitions([records[:45], records[45:]])       # two partitions
    DistriOptimizer(net, data, loss, opt, batch_size=20).optimize()
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..data.records import convert_records
from ..errors import InvalidArgumentError
from .interface import (GradientRunner, HopRunner, PartitionMetrics, RoundEntry, RoundRunner,
                        RunnerOptions)
from ..executor.replicas import Replica, ReplicaSpec
from ..executor.worker_cache import WorkerCache
from ..executor.shard_store import Shard, ShardSummary, summarize_arrays
from ..executor.hop_task import HopPartitionResult, HopSpec, HopTask
from ..executor.round_task import RoundTask
from ..executor.step import StepSpec, compute_gradient, compute_metric_sums
from ..metrics import ValidationMetric
from ..transport.allreduce import AllReduceResult, sum_in_order
from ..transport.codecs import make_codec
from ..transport.flat_layout import ParamLayout
from ..transport.weight_refresh import HeldValue, RefreshPublisher, StateVersion

__all__ = ["LocalPartitions", "InProcessRunner"]


class LocalPartitions:
    """Training (or validation) data held in this process: a list of partitions, each an
    iterable of records (``(features, label)`` pairs or ``ArrayBlock`` s), as an RDD's
    partitions would hold them.

    Example: ``LocalPartitions([list(zip(x[:45], y[:45])), list(zip(x[45:], y[45:]))])``.
    """

    def __init__(self, partitions: Sequence[Iterable[Any]]) -> None:
        self.partitions = [list(p) for p in partitions]

    def getNumPartitions(self) -> int:
        """The number of partitions (named like ``RDD.getNumPartitions``)."""
        return len(self.partitions)


@dataclass
class InProcessData:
    """A :class:`LocalPartitions` converted to shards in memory."""

    name: str
    summaries: list[ShardSummary] = field(default_factory=list)
    shards: list[Shard | None] = field(default_factory=list)
    shards_rebuilt: int = 0
    placement_misses: int = 0

    @property
    def num_partitions(self) -> int:
        return len(self.summaries)

    @property
    def held_bytes(self) -> int:
        """The bytes of the shards' arrays, held in this process."""
        return sum(s.nbytes for s in self.summaries)


@contextlib.contextmanager
def _task_environment() -> Iterator[None]:
    """What a Spark task sees that the caller must not: one torch thread, its own RNG use."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Fit:
    """One fit of the in-process runner: its spec's pickle, its replicas (by sub-replica), its
    layout, codec, precision and weights' refresh; ``round_models``: its local rounds' model kept
    between rounds (as in a worker: :func:`sparkdl.executor.round_task.round_model`; here
    without freezing this process's objects out of the garbage collection)."""

    spec: bytes
    replicas: dict[int, Replica]
    layout: ParamLayout
    codec: Any
    precision: str
    publisher: RefreshPublisher
    round_models: WorkerCache = field(default_factory=lambda: WorkerCache(1, freeze=False))
    states: str | None = None

    def state_root(self) -> str:
        """Where its local rounds' partitions keep their inner states (a private directory of
        this process, removed when the fit closes)."""
        if self.states is None:
            self.states = tempfile.mkdtemp(prefix="sparkdl-round-states-")
        return self.states

    def replica(self, sub: int = 0) -> Replica:
        if sub not in self.replicas:      # another copy, as a worker unpickles it
            self.replicas[sub] = Replica(pickle.loads(self.spec), str(self.replicas[0].device))
        return self.replicas[sub]


class InProcessRunner(GradientRunner, HopRunner, RoundRunner):
    """Runs the loop's jobs in this process (see the module docstring)."""

    spark_context = None

    def __init__(self) -> None:
        self._fits: dict[int, _Fit] = {}
        self._default: int | None = None

    def task_cores(self) -> int:
        return 1            # tasks run one after another, each with one torch thread

    def schedules_gpus(self) -> bool:
        return False

    def check_device(self, device: str) -> None:
        if device == "cuda" and not torch.cuda.is_available():
            raise InvalidArgumentError("device='cuda' but CUDA is not available in this process")

    def load(self, data: LocalPartitions, name: str, float_dtype: str,
             ragged: tuple[int, ...] = ()) -> InProcessData:
        held = InProcessData(name)
        for partition, records in enumerate(data.partitions):
            try:
                feats, labels = convert_records(partition, iter(records), np.dtype(float_dtype),
                                                ragged)
            except (TypeError, ValueError) as exc:
                held.summaries.append(ShardSummary(partition=partition, error=str(exc)))
                held.shards.append(None)
                continue
            held.summaries.append(summarize_arrays(partition, feats, labels))
            held.shards.append(Shard(feats, labels))
        return held

    def start(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
              train: InProcessData) -> str:
        fit, how = self.add_fit(spec, layout, options, train)
        if self._default is None:
            self._default = fit
        return how

    def add_fit(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
                train: InProcessData) -> tuple[int, str]:
        """One more fit (see :meth:`sparkdl.runners.spark_rdd.SparkRddRunner.add_fit`)."""
        from pyspark import cloudpickle

        # A worker's replica is unpickled from the broadcast spec: the same round trip here.
        device = "cuda:0" if options.device != "cpu" and torch.cuda.is_available() else "cpu"
        pickled = cloudpickle.dumps(spec)
        number = max(self._fits, default=-1) + 1
        # the same refresh as the executors' (row deltas), with values held in this process
        self._fits[number] = _Fit(
            pickled, {0: Replica(pickle.loads(pickled), device)}, layout,
            make_codec(options.compression, layout.numpy_dtype, layout.num_param_values),
            options.precision, RefreshPublisher(HeldValue, layout.fingerprint))
        return number, (f"in-process sum of {layout.size} values"
                        + (f" (gradients in {options.compression})"
                           if options.compression else ""))

    def gradients(self, data: InProcessData, step: StepSpec, weights: StateVersion
                  ) -> AllReduceResult:
        assert self._default is not None
        return self.gradients_together(data, [(self._default, step, weights)])[0]

    def gradients_together(self, data: InProcessData,
                           entries: Sequence[tuple[int, StepSpec, StateVersion]]
                           ) -> list[AllReduceResult]:
        """Every fit's iteration, partition by partition (each partition's fits in the
        entries' order, as a pass's task computes them), each fit summed on its own."""
        submitted_at = time.time()
        fits = [self._fits[number] for number, _, _ in entries]
        refreshes = [fit.publisher.publish(weights)
                     for fit, (_, _, weights) in zip(fits, entries)]
        reports: list[list[Any]] = [[] for _ in entries]
        parts: list[list[Any]] = [[] for _ in entries]
        with _task_environment():
            for partition in range(data.num_partitions):
                for k, (fit, (_, step, _), refresh) in enumerate(zip(fits, entries, refreshes)):
                    vector, report = compute_gradient(step, partition, data.shards[partition],
                                                      fit.replica, refresh)
                    reports[k].append(report)
                    parts[k].append((partition, None if vector is None else
                                     fit.codec.encode(vector, 0)))
        for fit in fits:
            fit.publisher.settle()
        return _summed(fits, parts, reports, submitted_at)

    def evaluate(self, data: InProcessData, weights: np.ndarray,
                 metrics: Sequence[ValidationMetric], batch_size: int, fit: int | None = None
                 ) -> list[PartitionMetrics]:
        one = self._fits[self._default if fit is None else fit]
        out = []
        with _task_environment():
            for partition, shard in enumerate(data.shards):
                sums, count = compute_metric_sums(shard, one.replica(), weights, list(metrics),
                                                  batch_size, one.precision)
                out.append(PartitionMetrics(partition, sums, count))
        return out

    def hop(self, data: InProcessData, bundles: dict[int, bytes],
            assignments: dict[int, list[tuple[int, HopSpec]]]) -> dict[int, HopPartitionResult]:
        """One sub-epoch of model hopping, partition by partition (see
        :meth:`sparkdl.runners.spark_rdd.SparkRddRunner.hop`)."""
        task = HopTask("", bundles, assignments, shards=data.shards)
        with _task_environment():
            return {p: task.compute(p, shard) for p, shard in enumerate(data.shards)}

    def rounds_together(self, data: InProcessData, entries: Sequence[RoundEntry]
                        ) -> list[AllReduceResult]:
        """Every fit's round, partition by partition, each fit's deltas summed on its own in
        partition order (see :meth:`sparkdl.runners.spark_rdd.SparkRddRunner.rounds_together`)."""
        submitted_at = time.time()
        fits = [self._fits[entry.fit] for entry in entries]
        tasks = [RoundTask("", entry.spec, entry.bundle, entry.start, entry.replay,
                           run_key="in-process", kept=fit.round_models,
                           state_root=fit.state_root())
                 for entry, fit in zip(entries, fits)]
        reports: list[list[Any]] = [[] for _ in entries]
        parts: list[list[Any]] = [[] for _ in entries]
        with _task_environment():
            for partition in range(data.num_partitions):
                for k, (fit, task) in enumerate(zip(fits, tasks)):
                    vector, report = task.compute(partition, data.shards[partition])
                    reports[k].append(report)
                    parts[k].append((partition, None if vector is None else
                                     fit.codec.encode(vector, 0)))
        return _summed(fits, parts, reports, submitted_at)

    def lost_data_reason(self, exc: BaseException) -> str | None:
        return None       # nothing is held anywhere it could be lost

    def memory_kill_reason(self, exc: BaseException) -> str | None:
        return None

    def driver_failure(self, exc: BaseException) -> str | None:
        return None

    def rebuild(self, data: InProcessData, reason: str) -> None:
        raise RuntimeError(f"in-process data cannot be lost ({reason})")  # pragma: no cover

    def close_fit(self, fit: int) -> None:
        """Forget one fit's replicas and refresh."""
        one = self._fits.pop(fit, None)
        if one is not None:
            one.publisher.close()
            if one.states is not None:
                shutil.rmtree(one.states, ignore_errors=True)

    def close(self) -> None:
        for number in list(self._fits):
            self.close_fit(number)


def _summed(fits: Sequence[_Fit], parts: list[list[Any]], reports: list[list[Any]],
            submitted_at: float) -> list[AllReduceResult]:
    """Each fit's vectors (its ``parts``, by partition) summed on their own, in partition
    order, with its tasks' ``reports``."""
    returned_at = time.time()
    results = []
    for fit, fit_parts, fit_reports in zip(fits, parts, reports):
        t0 = time.perf_counter()
        vector = sum_in_order(fit_parts, fit.codec, 0, fit.layout.size)
        results.append(AllReduceResult(vector, reduce_s=time.perf_counter() - t0,
                                       reports=fit_reports, submitted_at=submitted_at,
                                       returned_at=returned_at))
    return results
