"""Per-iteration and per-validation records of a training run.

Example::

    trained = opt.optimize()
    opt.summary.iterations[-1].loss      # last iteration's training loss
    opt.summary.to_pandas()              # one row per iteration
    opt.summary.validation_pandas()      # one row per validation
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["IterationRecord", "ValidationRecord", "TrainingSummary"]


@dataclass
class IterationRecord:
    """One iteration. Times are seconds: ``compute_s`` the slowest task's forward and backward,
    ``reduce_s`` the slowest reducer (reading its blocks and summing), ``update_s`` the driver's
    optimizer step, ``broadcast_s`` creating the weights' broadcast; from wall-clock instants
    (see :meth:`sparkdl.transport.allreduce.AllReduceResult.timeline`): ``launch_s`` job submission until
    the last task computes, ``exchange_s`` shuffle write and read until the last reducer starts,
    ``collect_s`` results travelling to the driver; ``other_s`` the rest of ``wall_s``. With
    ``precision="16-mixed"``: the ``loss_scale`` used and whether the step was skipped because
    the scaled gradient had inf or NaN values. Memory:
    the driver's resident set after the update and the largest Python worker's after its task,
    in bytes. ``shards_rebuilt``: training shards built again during this iteration (after a
    placement miss or a lost executor; see :mod:`sparkdl.runners.cached_rdd`). ``executors``:
    where each partition's vector was computed (``executor_<host>_<id>``; empty where that is
    not known, e.g. local mode)."""

    iteration: int
    epoch: int
    records: int
    loss: float
    learning_rate: float
    samples_per_s: float
    wall_s: float
    compute_s: float
    reduce_s: float
    update_s: float
    broadcast_s: float
    other_s: float
    driver_rss_bytes: int = 0
    worker_rss_bytes: int = 0
    # spans from the job's wall-clock instants
    launch_s: float = 0.0
    exchange_s: float = 0.0
    collect_s: float = 0.0
    # precision="16-mixed" only
    loss_scale: float = 0.0
    step_skipped: bool = False
    shards_rebuilt: int = 0
    executors: dict[int, str] = field(default_factory=dict)


@dataclass
class ValidationRecord:
    """Validation metrics after ``iteration``."""

    iteration: int
    epoch: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainingSummary:
    """Everything recorded during training, in order; and over this driver's run (a resumed run
    counts from its resume): ``shards_rebuilt``, the training and validation shards built
    again, and ``placement_misses``, the tasks that ran where their shard was not (each cost
    the rebuild of that one shard); with ``spark.sparkdl.shardReplicas`` >= 2,
    ``replicas_built``, the replica shards built (after the first build and again after a lost
    executor), and ``executors_avoided``, how many times an executor found slow had its tasks
    sent elsewhere (:mod:`sparkdl.runners.slow_executors`). ``shard_bytes``: the bytes of the
    training and validation shards on the executors at the end (their arrays as held, on disk
    or in worker memory; every holder counted, so about r times the data with
    ``shardReplicas`` r)."""

    iterations: list[IterationRecord] = field(default_factory=list)
    validations: list[ValidationRecord] = field(default_factory=list)
    shards_rebuilt: int = 0
    placement_misses: int = 0
    replicas_built: int = 0
    executors_avoided: int = 0
    shard_bytes: int = 0

    def to_pandas(self) -> Any:
        """One row per iteration (needs pandas)."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.iterations])

    def validation_pandas(self) -> Any:
        """One row per validation, one column per metric (needs pandas)."""
        import pandas as pd

        return pd.DataFrame([{"iteration": v.iteration, "epoch": v.epoch, **v.metrics}
                             for v in self.validations])
