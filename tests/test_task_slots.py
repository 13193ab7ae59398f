"""Task slots: the estimators' default training partitions, the engine's waves warning, and when
spark_session points the executors at this interpreter.

The slot arithmetic for every master form, the waves message, and the PYSPARK_PYTHON decision
run without Spark; one local-cluster[2,2,1024] job with spark.task.cpus=2 (its own driver
process: one SparkContext per process) checks what the fits actually used and said.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import pytest

from sparkdl.engine.fit.checks.task_parallelism import waves_message, warn_waves
from sparkdl.runners import InProcessRunner, LocalPartitions, runner_for
from sparkdl.spark_settings import sets_pyspark_python
from sparkdl.task_slots import cluster_slots, counted_executors, slots_of, task_slots

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("master, task_cpus, local_cores, expected", [
    ("local", 1, 8, 1),
    ("local", 4, 8, 1),
    ("local[8]", 1, 2, 8),
    ("local[8]", 2, 2, 4),
    ("local[8]", 3, 2, 2),
    ("local[2]", 4, 2, 1),             # at least one
    ("local[*]", 2, 12, 6),
    ("local[*]", 1, 5, 5),
    ("local[6,3]", 2, 1, 3),           # the retries do not count
    ("local-cluster[2,2,1024]", 2, 1, 2),
    ("local-cluster[3,4,1024]", 1, 1, 12),
    ("local-cluster[3,5,1024]", 2, 1, 6),
    ("local-cluster[2,1,1024]", 2, 1, 1),
])
def test_slots_of_local_masters(master, task_cpus, local_cores, expected):
    assert slots_of(master, task_cpus, local_cores=local_cores) == expected


def test_slots_of_cluster_masters():
    # 16 executors x 4 cores: 64 cores, 16 slots with spark.task.cpus=4
    assert slots_of("spark://h:7077", 4, executors=16, executor_cores=4) == 16
    assert slots_of("spark://h:7077", 1, executors=16, executor_cores=4) == 64
    assert slots_of("yarn", 2, executors=3, executor_cores=5) == 6       # 5 // 2 per executor
    # cores per executor unknown: all the registered cores over spark.task.cpus
    assert slots_of("spark://h:7077", 4, executors=3, total_cores=24) == 6
    # nothing known: at least one
    assert slots_of("k8s://https://h:443", 2) == 1
    # GPUs: 2 per executor, half a GPU per task, 8 cores: 4 tasks per executor, not 8
    assert slots_of("spark://h:7077", 1, executors=2, executor_cores=8, executor_gpus=2,
                    task_gpus=0.5) == 8
    assert slots_of("spark://h:7077", 1, executors=2, executor_cores=8, executor_gpus=1,
                    task_gpus=0.1) == 16       # ten per GPU, the cores decide
    assert slots_of("local-cluster[2,4,1024]", 1, executor_gpus=1, task_gpus=1) == 2
    assert slots_of("spark://h:7077", 1, executors=2, total_cores=16, executor_gpus=1,
                    task_gpus=1) == 2


def test_counted_executors_with_and_without_dynamic_allocation():
    assert counted_executors(5, {}.get) == 5
    assert counted_executors(0, {"spark.executor.instances": "4"}.get) == 4
    assert counted_executors(3, {"spark.executor.instances": "4"}.get) == 3     # registered
    dynamic = {"spark.dynamicAllocation.enabled": "true",
               "spark.dynamicAllocation.initialExecutors": "6",
               "spark.dynamicAllocation.minExecutors": "2",
               "spark.dynamicAllocation.maxExecutors": "50"}
    assert counted_executors(0, dynamic.get) == 6       # never maxExecutors
    assert counted_executors(9, dynamic.get) == 9
    assert counted_executors(0, {"spark.dynamicAllocation.enabled": "true",
                                 "spark.dynamicAllocation.minExecutors": "3"}.get) == 3


def test_cluster_slots_reads_the_settings():
    conf = {"spark.task.cpus": "4", "spark.executor.cores": "4"}
    assert cluster_slots("spark://h:7077", conf.get, registered=16,
                         default_parallelism=64) == 16
    # YARN and Kubernetes default spark.executor.cores to 1
    assert cluster_slots("yarn", {}.get, registered=7, default_parallelism=7) == 7
    # standalone without spark.executor.cores: the registered cores
    assert cluster_slots("spark://h:7077", {"spark.task.cpus": "2"}.get, registered=2,
                         default_parallelism=12) == 6
    # no executor up yet, dynamic allocation: the executors Spark starts with
    dynamic = dict(conf, **{"spark.dynamicAllocation.enabled": "true",
                            "spark.dynamicAllocation.initialExecutors": "5"})
    assert cluster_slots("yarn", dynamic.get, registered=0, default_parallelism=2) == 5
    # no executor known at all: sc.defaultParallelism // spark.task.cpus
    assert cluster_slots("spark://h:7077", conf.get, registered=0, default_parallelism=8) == 2
    # GPUs: executors' GPUs without a task amount: sparkdl's stages ask one each
    gpus = {"spark.executor.cores": "8", "spark.executor.resource.gpu.amount": "2"}
    assert cluster_slots("spark://h:7077", gpus.get, registered=3) == 6
    assert cluster_slots("spark://h:7077", gpus.get, registered=3, device="cpu") == 24
    assert cluster_slots("spark://h:7077", dict(gpus, **{
        "spark.task.resource.gpu.amount": "0.25"}).get, registered=3) == 24
    assert cluster_slots("local-cluster[2,2,1024]", {"spark.task.cpus": "2"}.get) == 2
    assert cluster_slots("local[*]", {"spark.task.cpus": "3"}.get, local_cores=7) == 2


def test_task_slots_of_the_local_session(spark):
    assert task_slots(spark) == 2                    # local[2], spark.task.cpus unset
    assert task_slots(spark.sparkContext) == 2


def test_waves_message_numbers():
    assert waves_message(2, 2) is None
    assert waves_message(1, 4) is None
    message = waves_message(9, 4)
    assert "9 partitions" in message and "4 tasks at once" in message
    assert "3 waves" in message
    assert "rdd.repartition(4)" in message and "numTrainWorkers=4" in message


def test_warn_waves_on_the_local_session(sc, caplog):
    rdd = sc.parallelize(range(10), 5)
    runner = runner_for(rdd)
    try:
        with caplog.at_level(logging.WARNING, logger="sparkdl"):
            said = warn_waves(rdd, runner, "auto")
        assert said is not None and "5 partitions" in said and "3 waves" in said
        assert [r.getMessage() for r in caplog.records if r.name == "sparkdl"] == [said]
        assert warn_waves(sc.parallelize(range(4), 2), runner, "auto") is None
        assert warn_waves(LocalPartitions([[1], [2], [3]]), InProcessRunner(), "auto") is None
    finally:
        runner.close()


@pytest.mark.parametrize("master, given, environ, starts, expected", [
    ("local[2]", set(), {}, True, True),
    ("local[*]", set(), {}, True, True),
    ("local", set(), {}, True, True),
    ("local-cluster[2,1,1024]", set(), {}, True, True),
    ("local[2]", set(), {}, False, False),            # a running context keeps its python
    ("local[2]", set(), {"PYSPARK_PYTHON": "/opt/py"}, True, False),
    ("local[2]", {"spark.pyspark.python"}, {}, True, False),
    ("local[2]", {"spark.pyspark.driver.python"}, {}, True, False),
    ("yarn", set(), {}, True, False),
    ("spark://h:7077", set(), {}, True, False),
    ("k8s://https://h:443", set(), {}, True, False),
])
def test_sets_pyspark_python(master, given, environ, starts, expected):
    assert sets_pyspark_python(master, given, environ, starts) is expected


@pytest.fixture(scope="module")
def cluster_result():
    proc = subprocess.run([sys.executable, os.path.join(HERE, "task_slots_job.py"),
                           "local-cluster[2,2,1024]"], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("\tat ")]
        pytest.fail(f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n" + "\n".join(lines[-80:]))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.cluster
def test_estimator_trains_on_the_task_slots_by_default(cluster_result):
    assert cluster_result["default_parallelism"] == 4
    assert cluster_result["slots"] == 2
    described = cluster_result["estimator"]["described"]
    assert len(described) == 1
    assert re.match(r"training on 48 samples in 2 partitions:", described[0]), described
    assert cluster_result["estimator"]["waves"] == []


@pytest.mark.cluster
def test_engine_warns_once_of_waves(cluster_result):
    assert cluster_result["rdd_partitions"] == 8
    engine = cluster_result["engine"]
    assert re.match(r"training on 40 samples in 8 partitions:", engine["described"][0])
    assert len(engine["waves"]) == 1
    said = engine["waves"][0]
    assert said.startswith("WARNING the training data has 8 partitions and the cluster runs "
                           "2 tasks at once"), said
    assert "each iteration runs in 4 waves" in said
    assert "rdd.repartition(2)" in said and "numTrainWorkers=2" in said
