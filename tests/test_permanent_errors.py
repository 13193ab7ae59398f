"""A permanent sparkdl error raised in a task (issue 35, 6): every task kind (gradient,
validation, shard build, the fill jobs that build missing shards) reports it instead of failing,
on the RDD runner and on the DataFrame runner (Spark Connect's, run here on the classic
session). The user gets the sparkdl error class with its message, and Spark does not retry the
task: no task of the run's jobs failed, and a failed task is the only thing Spark retries (so
this holds under any ``spark.task.maxFailures``; local[2] allows one attempt, where a failing
task would be counted once)."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import SmallNet, make_rdd
from sparkdl import DistriOptimizer
from sparkdl.errors import SparkdlError, TrainingStepError
from sparkdl.executor.live_runs import new_key
from sparkdl.executor.replicas import ReplicaSpec
from sparkdl.metrics import Loss
from sparkdl.runners import ConnectDataFrameRunner, SparkRddRunner
from sparkdl.runners.interface import RunnerOptions
from sparkdl.transport.flat_layout import ParamLayout
from sparkdl.triggers import MaxIteration, SeveralIteration

MARK = 99.0
"""The first feature of the one marked record (row 6 of partition 1: never among the few
samples the driver's dry run tries, which are partition 0's first)."""

MARKED_ROW = 14
NORMALISER_ERROR = "The training step's normaliser must be finite and >= 0; it returned nan."


class SensorError(SparkdlError):
    """A permanent error of the user's own (raised by their code in a build task)."""

    permanent = True


def marked_step(model, inputs, target):
    """A training step whose normaliser is NaN on a batch holding the marked record."""
    per_row = F.cross_entropy(model(*inputs), target, reduction="none")
    marked = bool((inputs[0][:, 0] == MARK).any())
    return per_row.sum(), float("nan") if marked else float(len(target))


def check_sensor(record):
    """The user's map function over an RDD's records: refuses the marked one."""
    if float(record[0][0]) == MARK:
        raise SensorError(f"sensor {MARKED_ROW} reads {MARK}")
    return record


def check_sensors(x):
    """The same check as a DataFrame's ``preprocess`` (a batch of feature rows)."""
    if (np.asarray(x)[:, 0] == MARK).any():
        raise SensorError(f"sensor {MARKED_ROW} reads {MARK}")
    return x


class CheckAfter:
    """``check`` once the file ``marker`` exists: the input turns bad after the first build."""

    def __init__(self, check, marker: str) -> None:
        self.check, self.marker = check, marker

    def __call__(self, value):
        return self.check(value) if os.path.exists(self.marker) else value


def records(marked: bool) -> list:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    y = (np.arange(16) % 3).astype(np.int64)
    if marked:
        x[MARKED_ROW, 0] = MARK
    return list(zip(x, y))


def frame(spark, marked: bool, preprocess=None):
    """The same records as DataFrame blocks in 2 partitions of 8, in order."""
    from pyspark.sql import functions as F_

    from sparkdl.data.dataframe_arrays import feature_sources, frame_blocks

    rows = records(marked)
    table = F_.array(*[F_.array(*[F_.lit(float(v)) for v in x]) for x, _ in rows])
    labels = F_.array(*[F_.lit(int(y)) for _, y in rows])
    df = spark.range(0, len(rows), 1, 2).select(
        F_.element_at(table, F_.col("id").cast("int") + 1).cast("array<float>")
        .alias("features"),
        F_.element_at(labels, F_.col("id").cast("int") + 1).alias("label"))
    return frame_blocks(df, feature_sources(df.schema, "features", []), "label", True, [],
                        preprocess, 2)


def data(kind: str, spark, sc, marked: bool, check=None):
    """The 16 records (the marked one in partition 1) as an RDD or as DataFrame blocks, read
    through the user's ``check`` (a map function, or ``preprocess``)."""
    if kind == "rdd":
        rdd = make_rdd(sc, records(marked), [8, 8])
        return rdd if check is None else rdd.map(check)
    return frame(spark, marked, check)


class FailedTasks:
    """Counts the jobs this thread starts inside a ``with`` block and their failed tasks
    (a job group of its own)."""

    def __init__(self, sc) -> None:
        self.sc, self.group = sc, f"sparkdl-test-{uuid.uuid4().hex}"

    def __enter__(self) -> "FailedTasks":
        self.sc.setJobGroup(self.group, "a test counting failed tasks")
        return self

    def __exit__(self, *exc) -> None:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            self.sc.setLocalProperty(key, None)

    def counts(self) -> tuple[int, int]:
        """(jobs, failed tasks) of the group."""
        tracker = self.sc.statusTracker()
        jobs = tracker.getJobIdsForGroup(self.group)
        stages = [s for j in jobs for s in (tracker.getJobInfo(j).stageIds
                                            if tracker.getJobInfo(j) else [])]
        failed = sum(tracker.getStageInfo(s).numFailedTasks for s in stages
                     if tracker.getStageInfo(s) is not None)
        return len(jobs), failed


def engine(train, step=None):
    torch.manual_seed(0)
    net = SmallNet()
    return DistriOptimizer(net, train, None if step else torch.nn.CrossEntropyLoss(),
                           torch.optim.SGD(net.parameters(), lr=0.1), batch_size=16,
                           end_trigger=MaxIteration(1), training_step=step, progress_bar=False)


KINDS = ["rdd", "dataframe"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("task", ["gradient", "validation"])
def test_gradient_and_validation_tasks_report_a_permanent_error(spark, sc, kind, task):
    opt = engine(data(kind, spark, sc, marked=task == "gradient"), marked_step)
    opt.set_validation(data(kind, spark, sc, marked=task == "validation"), SeveralIteration(1),
                       [Loss()], batch_size=8)
    with FailedTasks(sc) as tasks, pytest.raises(TrainingStepError) as raised:
        opt.optimize()
    assert str(raised.value) == NORMALISER_ERROR
    jobs, failed = tasks.counts()
    assert jobs > 0 and failed == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_shard_build_task_reports_a_permanent_error(spark, sc, kind):
    check = check_sensor if kind == "rdd" else check_sensors
    opt = engine(data(kind, spark, sc, marked=True, check=check))
    with FailedTasks(sc) as tasks, pytest.raises(SensorError) as raised:
        opt.optimize()
    assert str(raised.value) == f"sensor {MARKED_ROW} reads {MARK}"
    jobs, failed = tasks.counts()
    assert jobs > 0 and failed == 0


@pytest.mark.parametrize("kind", KINDS)
def test_fill_tasks_report_a_permanent_error(spark, sc, kind, tmp_path):
    """Validation tasks that find no shard where they run: the fill job builds the shards and
    computes there, and reports a permanent error of either part (the step on the filled
    shard; the input, read again for the build)."""
    marker = str(tmp_path / "input-changed")
    check = CheckAfter(check_sensor if kind == "rdd" else check_sensors, marker)
    runner = SparkRddRunner(sc) if kind == "rdd" else ConnectDataFrameRunner(spark)
    try:
        train = runner.load(data(kind, spark, sc, marked=False), "training", "float32")
        val = runner.load(data(kind, spark, sc, marked=True, check=check), "validation",
                          "float32")
        torch.manual_seed(0)
        net = SmallNet()
        layout = ParamLayout(net)
        runner.start(ReplicaSpec(net, None, "mean", training_step=marked_step), layout,
                     RunnerOptions(device="cpu"), train)
        weights = layout.state_vector(net)

        val.data_key = new_key("validation")     # no task finds its shard: fill jobs
        with FailedTasks(sc) as tasks:
            rows = runner.evaluate(val, weights, [Loss()], 8)
        assert val.placement_misses == 2
        assert [(r.partition, r.count, r.fatal) for r in rows] == \
            [(0, 8, None), (1, 0, ("TrainingStepError", NORMALISER_ERROR))]
        assert rows[0].sums is not None and tasks.counts()[1] == 0

        open(marker, "w").close()                # the input now fails the user's check
        val.data_key = new_key("validation")
        with FailedTasks(sc) as tasks, pytest.raises(SensorError) as raised:
            runner.evaluate(val, weights, [Loss()], 8)
        assert str(raised.value) == f"sensor {MARKED_ROW} reads {MARK}"
        jobs, failed = tasks.counts()
        assert jobs > 0 and failed == 0
    finally:
        runner.close()
