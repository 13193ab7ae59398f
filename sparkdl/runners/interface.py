"""The seam between the SGD loop and the cluster: what the loop asks of "the executors".

The loop (:mod:`sparkdl.engine.strategies.sync.step`) never touches Spark. It asks an
:class:`IterationRunner` to hold the training and validation data where the tasks run, to run one
iteration's job (weights in, the sum over partitions of every task's flat vector out, with the
tasks' reports), to run a validation job, and to repair lost data. Implementations:

* :class:`sparkdl.runners.spark_rdd.SparkRddRunner` -- RDD jobs, a weight broadcast per
  iteration, the shuffle or driver AllReduce (:mod:`sparkdl.transport.allreduce`);
* :class:`sparkdl.runners.in_process.InProcessRunner` -- the same tasks as plain function calls
  in this process, summed in the same order: no Spark, bitwise the same result.

What a strategy needs beyond the iteration is a protocol of its own (:class:`GradientRunner`,
:class:`PassRunner`, :class:`HopRunner`, :class:`RoundRunner`); each runner class names the ones it implements among
its bases, and a strategy whose protocol a runner lacks is refused before any job.

Every implementation must sum in partition order (0, 1, 2, ...) so that all of them, and any
retry, give bitwise the same vector.

Example::

    runner = runner_for(training_data)                 # sparkdl.runners
    train = runner.load(training_data, "training", "float32")
    runner.start(ReplicaSpec(model, criterion, "mean"), layout, RunnerOptions(), train)
    result = runner.gradients(train, step, weights)    # AllReduceResult: vector + reports
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from ..executor.replicas import ReplicaSpec
from ..executor.shard_store import ShardSummary
from ..executor.step import PartitionMetrics, StepSpec
from ..metrics import ValidationMetric
from ..transport.allreduce import AllReduceResult
from ..transport.flat_layout import ParamLayout
from ..transport.weight_refresh import StateVersion

__all__ = ["DataHandle", "RunnerOptions", "PartitionMetrics", "IterationRunner", "GradientRunner",
           "PassRunner", "HopRunner", "RoundEntry", "RoundRunner"]


class DataHandle(Protocol):
    """Data a runner holds for the tasks: one summary per partition, in partition order, and
    how many of its shards were built again (after misses or losses) and how many tasks ran
    where their shard was not."""

    name: str
    summaries: list[ShardSummary]
    shards_rebuilt: int
    placement_misses: int

    @property
    def num_partitions(self) -> int: ...


@dataclass(frozen=True)
class RunnerOptions:
    """How vectors are summed: ``allreduce`` ("auto", "shuffle", "driver"), the number of
    blocks of the shuffle, and the wire compression (None or "bf16"); where tasks compute
    (``device``: "auto", "cpu", "cuda") and in which ``precision``."""

    allreduce: str = "auto"
    num_blocks: int | None = None
    compression: str | None = None
    device: str = "auto"
    precision: str = "32"


class IterationRunner(Protocol):
    """Runs the loop's jobs (see the module docstring)."""

    spark_context: Any
    """The classic SparkContext the runner's jobs run on (None for the in-process and the
    Spark Connect runners)."""

    def task_cores(self) -> int:
        """The cores each task owns (``spark.task.cpus``; 1 in process): what sub-replicas
        default to (:mod:`sparkdl.engine.fit.checks.task_parallelism`)."""

    def schedules_gpus(self) -> bool:
        """Whether the cluster gives the executors GPUs (then a task keeps one replica)."""

    def check_device(self, device: str) -> None:
        """Raise a clear error, before any cluster work, if ``device`` cannot be had."""

    def load(self, data: Any, name: str, float_dtype: str,
             ragged: tuple[int, ...] = ()) -> DataHandle:
        """Hold ``data`` as per-partition shards where the tasks run (one job); inputs in
        ``ragged`` are variable-length; bad records are reported in the summaries' ``error``,
        never raised here (a permanent sparkdl error a build task reported is raised, as its
        class with its message)."""

    def start(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
              train: DataHandle) -> str:
        """Ship the model to the tasks and choose how ``train``'s vectors are summed; returns
        that choice in words, for the log."""

    def gradients(self, data: DataHandle, step: StepSpec, weights: StateVersion
                  ) -> AllReduceResult:
        """One iteration's job: every partition's weighted gradient and buffers, summed in
        partition order. Partitions whose shard was not found are marked in the reports.
        ``weights``: the driver's state and what changed since the last version
        (:mod:`sparkdl.transport.weight_refresh`); a runner may send it whole."""

    def evaluate(self, data: DataHandle, weights: np.ndarray,
                 metrics: Sequence[ValidationMetric], batch_size: int
                 ) -> list[PartitionMetrics]:
        """Metric sums of every partition of ``data``, in partition order; a partition whose
        task met a permanent error carries it in ``fatal`` (the caller raises it)."""

    def lost_data_reason(self, exc: BaseException) -> str | None:
        """The line saying that a failed job lost runner-held data (a rebuild repairs it), or
        None when the failure is anything else."""

    def memory_kill_reason(self, exc: BaseException) -> str | None:
        """The line saying that a failed job lost an executor to its memory limit, or None (a
        rebuild then only helps if the limit was hit by chance)."""

    def driver_failure(self, exc: BaseException) -> str | None:
        """Why a failed job failed for the driver's memory, in words naming the setting to
        raise, or None (a rebuild of executor-held data cannot help then)."""

    def rebuild(self, data: DataHandle, reason: str) -> None:
        """Hold ``data`` again after a loss (``reason`` goes to the log)."""

    def close(self) -> None:
        """Release everything held for the run (best effort; never raises)."""


class PassRunner(IterationRunner, Protocol):
    """A runner that can also run several fits' iterations in one job (a pass:
    :mod:`sparkdl.engine.fit_set`). Its ``start`` adds the first fit, which ``gradients`` and
    ``evaluate`` serve when no fit is named."""

    def add_fit(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
                train: DataHandle) -> tuple[int, str]:
        """Ship one more fit's model to the tasks; its number and how its vectors are summed
        alone (for the log). The fits share the first fit's ``options``."""

    def gradients_together(self, data: DataHandle,
                           entries: Sequence[tuple[int, StepSpec, StateVersion]]
                           ) -> list[AllReduceResult]:
        """One job for the iteration of every ``(fit, step, weights)``: each fit's result
        bitwise what its own job gives (its vector summed in partition order)."""

    def close_fit(self, fit: int) -> None:
        """Release one fit's replicas and broadcasts (the data stays)."""


@runtime_checkable
class GradientRunner(Protocol):
    """What the synchronous strategy needs (:mod:`sparkdl.engine.strategies.sync`): one fit's
    gradient job (every :class:`IterationRunner` has it)."""

    def gradients(self, data: DataHandle, step: StepSpec, weights: StateVersion
                  ) -> AllReduceResult:
        """The summed gradient of one iteration (see :class:`IterationRunner`)."""


@runtime_checkable
class HopRunner(Protocol):
    """What model hopping needs (:mod:`sparkdl.engine.strategies.hop`): jobs in which each
    task trains the models assigned to its partition, one after another, where its shard
    sits."""

    def hop(self, data: DataHandle, bundles: dict[int, bytes],
            assignments: dict[int, list[tuple[int, Any]]]) -> dict[int, Any]:
        """One hop job: for each partition with assignments, the task's result (its models'
        reports, whether its shard was missing), by partition."""


@dataclass(frozen=True)
class RoundEntry:
    """One fit's local round in a round job: the fit's number on the runner, the round's
    :class:`~sparkdl.executor.round_task.RoundSpec`, the round's state vector (``start``),
    the fit's pickled bundle (model, optimizer, scheduler, clipping; the same bytes every round
    of the fit) and, when partitions' inner states have to be rebuilt, the
    :class:`~sparkdl.executor.round_task.RoundReplay` that rebuilds them (``replay``)."""

    fit: int
    spec: Any
    start: np.ndarray
    bundle: bytes
    replay: Any = None


@runtime_checkable
class RoundRunner(Protocol):
    """What local rounds need (:mod:`sparkdl.engine.strategies.rounds`): a job in which each
    partition's task trains its own copy of a fit for a round where its shard sits and the
    weighted deltas are summed in partition order, as a gradient job's vectors."""

    def rounds_together(self, data: DataHandle, entries: Sequence[RoundEntry]
                        ) -> list[Any]:
        """One job for every entry's round: each fit's
        :class:`~sparkdl.transport.allreduce.AllReduceResult` (its reports
        :class:`~sparkdl.executor.round_task.RoundReport` s)."""
