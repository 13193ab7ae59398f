"""Shard replicas and placement that learns (``spark.sparkdl.shardReplicas``).

In process: the rule that finds slow executors and the choice of holders
(:mod:`sparkdl.runners.slow_executors`, :mod:`sparkdl.runners.shard_placement`) and the setting's
check. In other driver processes: a slow executor with replicas and speculation, an executor
killed while holding replicas, and a replica whose content differs, each against the clean
local[2] run's weights.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

import cluster_job
from models import bitwise_equal
from sparkdl.errors import InvalidArgumentError
from sparkdl.runners.shard_placement import ShardPlacement
from sparkdl.runners.slow_executors import SlowExecutors, SlowRule, TaskTiming
from sparkdl.spark_settings import shard_replicas
from test_local_cluster import HERE, run_job
from test_stragglers import SIZES, SPECULATION, run_with_slow_executor

A, B, C = "executor_h1_1", "executor_h2_2", "executor_h2_3"


def iteration(seconds: dict[str, float], attempt: int = 0) -> list[TaskTiming]:
    return [TaskTiming(p, e, s, attempt) for p, (e, s) in enumerate(seconds.items())]


def test_an_executor_slow_three_iterations_in_a_row_is_avoided_then_gets_its_share_back():
    slow = SlowExecutors(SlowRule(cooldown=4))
    holders = {0: [A, B], 1: [B, A]}
    for _ in range(2):
        slow.observe(iteration({A: 1.3, B: 0.1}), holders)
        assert slow.avoided() == set()
    events = slow.observe(iteration({A: 1.3, B: 0.1}), holders)
    assert slow.avoided() == {A} and "slow in 3 iterations in a row" in events[0]
    for _ in range(3):
        slow.observe([TaskTiming(0, B, 0.1, 0), TaskTiming(1, B, 0.1, 0)], holders)
        assert slow.avoided() == {A}
    events = slow.observe([TaskTiming(0, B, 0.1, 0), TaskTiming(1, B, 0.1, 0)], holders)
    assert slow.avoided() == set() and "gets its partitions back" in events[-1]
    # slow again in its first iteration back: avoided at once, twice as long
    slow.observe(iteration({A: 1.3, B: 0.1}), holders)
    assert slow.avoided() == {A} and slow.avoided_until[A] == slow.iteration + 8
    for _ in range(8):
        slow.observe([TaskTiming(0, B, 0.1, 0), TaskTiming(1, B, 0.1, 0)], holders)
    assert slow.avoided() == set()
    # recovered: its first iteration back ends the probation, and the cooldown is reset
    events = slow.observe(iteration({A: 0.12, B: 0.1}), holders)
    assert events == [f"executor {A} is no longer slow"] and A not in slow.probation
    assert slow.avoidances == 2


def test_a_copy_that_wins_marks_the_other_holder_and_noise_marks_nobody():
    slow = SlowExecutors(SlowRule(iterations=1))
    holders = {0: [A, B], 1: [B, A]}
    # a speculative copy (attempt 1) of partition 0 won on B: A ran the attempt that lost
    assert slow.slow_in([TaskTiming(0, B, 0.1, 1), TaskTiming(1, B, 0.1, 0)], holders) == {A}
    # twice as slow but under min_excess_s, and slower by 0.5 s but under twice as slow
    assert slow.slow_in(iteration({A: 0.05, B: 0.02}), holders) == set()
    assert slow.slow_in(iteration({A: 1.4, B: 0.9}), holders) == set()
    # never every working executor: each lost a race to a copy on the other
    slow.observe([TaskTiming(0, B, 0.1, 1), TaskTiming(1, A, 0.1, 1)], holders)
    assert slow.avoided() == set()
    slow.observe([TaskTiming(0, B, 0.1, 1), TaskTiming(1, B, 0.1, 0)], holders)
    assert slow.avoided() == {A}


def test_placement_prefers_healthy_holders_and_builds_replicas_on_other_hosts():
    placement = ShardPlacement(2)
    for p, h in enumerate([A, B, A]):
        placement.hold(p, h)
    alive = [A, B, C]
    wanted = placement.wanted({0: 10, 1: 10, 2: 10, 3: 0}, alive)
    # other hosts first (A is on h1; B and C on h2), then the executor holding fewest shards
    assert wanted == {0: C, 1: A, 2: B}
    for p, h in wanted.items():
        placement.hold(p, h)
    assert placement.wanted({0: 10, 1: 10, 2: 10}, alive) == {}
    assert placement.preferences(3, alive) == [[A, C], [B, A], [A, B]]
    placement.slow.avoided_until[A] = 5
    assert placement.preferences(3, alive) == [[C], [B], [B]]
    assert placement.forget_lost([A, B]) == [C]
    assert placement.holders[0] == [A]
    assert placement.wanted({0: 10, 1: 10, 2: 10}, [A, B]) == {0: B}
    # a partition whose every holder is avoided goes to a healthy executor (a fill)
    assert placement.preferences(1, [A, B]) == [[B]]


@pytest.mark.parametrize("value", ["0", "two", "9", "1.5"])
def test_a_bad_replica_count_is_refused_naming_the_value(value):
    with pytest.raises(InvalidArgumentError, match=re.escape(f"shardReplicas='{value}'")):
        shard_replicas(lambda key: value)
    assert shard_replicas(lambda key: "") == 1 and shard_replicas(lambda key: "2") == 2


def _fails_on_partition_3(index, rows):
    if index == 3:
        raise ValueError("partition 3 is broken")
    return rows


def _stamped(value):
    started = time.time()
    time.sleep(0.5)
    return value, started, time.time()


def test_replica_jobs_have_one_task_each_and_carry_the_callers_job_group(sc):
    """Replica builds run as single-task jobs (Spark never speculates a stage's only task),
    from threads that carry the caller's local properties; rows in the order asked, a failing
    job's error raised, and one job at a time per lane (the executor targeted)."""
    from sparkdl.executor.replica_build import as_collected
    from sparkdl.runners.targeted_rdd import single_task_jobs

    rdd = sc.parallelize(range(12), 6).map(lambda v: v * 10)
    group = "sparkdl-test-single-task-jobs"
    sc.setJobGroup(group, "single-task jobs")
    try:
        rows = single_task_jobs(sc, rdd, [4, 1, 5], as_collected, at_once=2)
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)
    assert rows == [80, 90, 20, 30, 100, 110]
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    assert len(jobs) == 3
    stages = [s for j in jobs for s in tracker.getJobInfo(j).stageIds]
    assert [tracker.getStageInfo(s).numTasks for s in stages] == [1, 1, 1]
    with pytest.raises(Exception, match="partition 3 is broken"):
        single_task_jobs(sc, rdd.mapPartitionsWithIndex(_fails_on_partition_3), [0, 3, 5],
                         as_collected)
    # jobs of one lane (the executor their task targets) never run at the same time
    stamped = sc.parallelize(range(6), 6).map(_stamped)
    spans = single_task_jobs(sc, stamped, [4, 1, 0, 5], as_collected, at_once=4,
                             lanes=["a", "a", "a", "b"])
    assert [v for v, _, _ in spans] == [4, 1, 0, 5]
    lane_a = sorted(spans[:3], key=lambda span: span[1])
    assert all(earlier[2] <= later[1] for earlier, later in zip(lane_a, lane_a[1:])), spans


def holders_from_log(stderr: str, pattern: str = r"partition: holders, first built first: "
                     r"(.*)\)") -> dict[int, list[str]]:
    line = re.search(pattern, stderr).group(1)
    return {int(p): h.split(", ") for p, h in (entry.split(": ") for entry in line.split("; "))}


@pytest.mark.cluster
@pytest.mark.parametrize("speculation", [True, False], ids=["speculation", "learned"])
def test_a_slow_executor_hands_its_partitions_to_the_replica_holders(sc, tmp_path, speculation):
    """Acceptance 1: one executor's tasks 1 s slower, two holders per shard. From the fourth
    iteration on, every partition's task ran on the other executor, the slow executor's
    partitions included (task placement from the tasks' reports), and the weights are bitwise
    the clean run's. With speculation a copy on the other holder starts at once and wins;
    without it the tasks' timings get the slow executor avoided after three slow iterations."""
    iterations = 8
    model, stdout, stderr = run_with_slow_executor(tmp_path, speculation=speculation,
                                                   replicas=2, iterations=iterations,
                                                   seconds=1.0)
    holders = holders_from_log(stderr)
    slow = [p for p, h in holders.items() if "127.0.0.2" in h[0]]
    assert slow and all(len(h) == 2 for h in holders.values()), holders
    ran = json.loads(re.search(r"task_executors=(.*)", stdout).group(1))
    assert len(ran) == iterations
    for where in ran[3:]:
        assert sorted(map(int, where)) == list(range(len(SIZES)))
        assert all("127.0.0.1_" in e for e in where.values()), (where, stderr[-3000:])
    if not speculation:
        assert int(re.search(r"executors_avoided=(\d+)", stdout).group(1)) == 1
        assert "was slow in 3 iterations in a row" in stderr
        assert any("127.0.0.2_" in e for where in ran[:3] for e in where.values())
    assert "placement_misses=0" in stdout
    clean, _ = cluster_job.train(sc, iterations=iterations, sizes=SIZES)
    assert bitwise_equal(model, clean)


@pytest.mark.cluster
def test_speculative_copies_of_rounds_on_replica_holders_give_the_clean_runs_bits(sc, tmp_path):
    """Local rounds of 4 (Adam inside) with one executor's tasks 1 s slower, two holders per
    shard and speculation: copies of the slow tasks start on the other holder, which reads the
    partition's optimizer state from its durable copy (every round's, with speculation on);
    the weights are bitwise the clean run's."""
    iterations = 8
    settings = dict(SPECULATION, **{"spark.sparkdl.roundStateDir": str(tmp_path / "states")})
    model, stdout, stderr = run_with_slow_executor(
        tmp_path, speculation=True, replicas=2, iterations=iterations, seconds=1.0,
        settings=settings, extra=("--local-steps", "4", "--outer", "nesterov"))
    assert "were retried by Spark" in stderr           # a copy (attempt 1) won a round
    assert "rebuilding them from their durable copy" not in stderr
    clean, _ = cluster_job.train(sc, iterations=iterations, sizes=SIZES, local_steps=4,
                                 outer="nesterov")
    assert bitwise_equal(model, clean)


@pytest.fixture(scope="module")
def clean_run(sc):
    return cluster_job.train(sc)      # the weights and the optimizer


def test_the_summary_counts_the_shards_bytes(clean_run):
    """Held once (local[2], no replicas): the arrays' bytes, six float32 features and an int64
    label per sample. (With replicas every holder counts: the killed-executor test below.)"""
    _, opt = clean_run
    assert opt.summary.shard_bytes == sum(cluster_job.SIZES) * (6 * 4 + 8)


@pytest.mark.cluster
def test_an_executor_killed_while_holding_replicas_has_them_rebuilt_elsewhere(clean_run,
                                                                              tmp_path):
    """Acceptance 2: three executors, two holders per shard; one is killed mid-training. The
    shards it held are built again on the survivors and the weights are bitwise clean."""
    marker = tmp_path / "fault-marker"
    model, proc = run_job(tmp_path, "local-cluster[3,1,1024]", "--fault", "executor",
                          "--marker", str(marker), "--warm-executors", "3",
                          "--conf", "spark.sparkdl.shardReplicas=2")
    assert marker.exists(), "no executor was killed"
    assert "iterations=6" in proc.stdout
    lost = re.search(r"executors \['(executor_[^']+)'\] have left", proc.stderr)
    assert lost, proc.stderr[-3000:]
    before = holders_from_log(proc.stderr)
    after = holders_from_log(proc.stderr, r"holders at the end \(partition: holders\): (.*)")
    held = [p for p, h in before.items() if lost.group(1) in h]
    assert held and before.keys() == after.keys(), (before, after)
    for p in before:
        assert len(after[p]) == 2 and lost.group(1) not in after[p], (p, before, after)
    for p in held:    # built again elsewhere: by a replica job, or by the fill of a retried task
        assert set(after[p]) - set(before[p]), (p, before, after)
    again = re.search(r"(\d+) replica shards built again in", proc.stderr)
    first = int(re.search(r"(\d+) replica shards built in", proc.stderr).group(1))
    assert int(re.search(r"replicas_built=(\d+)", proc.stdout).group(1)) == \
        first + (int(again.group(1)) if again else 0)
    assert int(re.search(r"shard_bytes=(\d+)", proc.stdout).group(1)) == \
        2 * clean_run[1].summary.shard_bytes       # two holders of every shard at the end
    assert bitwise_equal(model, clean_run[0])


@pytest.mark.cluster
def test_a_replica_that_differs_from_the_first_shard_is_refused(tmp_path):
    """Acceptance 3: partition 2's source gives other samples when read again (a stale or
    tampered source): the replica is refused and the fit stops before training, naming the
    partition."""
    marker = tmp_path / "changed"
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "cluster_job.py"), "local-cluster[2,1,1024]",
         str(tmp_path / "w.pt"), "--changing-partition", "2", "--marker", str(marker),
         "--warm-executors", "2", "--conf", "spark.sparkdl.shardReplicas=2"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert marker.exists()
    assert ("TrainingDataError: Partition 2 of the training data gave a replica shard that "
            "differs from the shard built first (the same number of samples with other "
            "contents") in proc.stderr, proc.stderr[-3000:]
    assert "iterations=" not in proc.stdout
