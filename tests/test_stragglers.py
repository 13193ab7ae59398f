"""Stragglers, exactly: one slow executor (its training tasks sleep 1.5 s) on a standalone
cluster whose two workers are two hosts to Spark (127.0.0.1 and 127.0.0.2: Spark never starts a
speculative copy on the host of the running attempt). With ``spark.speculation=true`` a copy of
the slow task runs on the other executor, which does not hold the shard: it fills it there and
computes the same vector, the first attempt to finish wins, and the weights are bitwise those of
a clean run. The wall times with and without speculation are printed (bench/stragglers.py
reports them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import cluster_job
from models import SmallNet, bitwise_equal
from test_standalone_cluster import StandaloneCluster

HERE = os.path.dirname(os.path.abspath(__file__))
ITERATIONS = 6
SIZES = [30, 25, 35, 20]          # every partition trains, whichever executor holds it
SPECULATION = {"spark.speculation": "true", "spark.speculation.interval": "50ms",
               "spark.speculation.quantile": "0.5", "spark.speculation.multiplier": "1.5",
               "spark.speculation.minTaskRuntime": "200ms",
               "spark.speculation.efficiency.enabled": "false",
               # a copy may start away from the task's shard only after the locality wait
               "spark.locality.wait": "300ms"}


def copies_started(tmp_path) -> int:
    """Task attempts after the first (speculative copies: no task fails here) that the two
    workers' executors ran, from their logs."""
    count = 0
    for worker in ("worker0", "worker1"):
        for root, _, files in os.walk(tmp_path / worker):
            if "stderr" in files:
                with open(os.path.join(root, "stderr")) as f:
                    count += len(re.findall(r"Running task \d+\.[1-9]\d* in stage", f.read()))
    return count


def run_with_slow_executor(tmp_path, speculation: bool, slow: bool = True, replicas: int = 1,
                           iterations: int = ITERATIONS, seconds: float = 1.5, cores: int = 1,
                           settings: dict[str, str] | None = None,
                           extra: tuple[str, ...] = ()) -> tuple[SmallNet, str, str]:
    """The cluster job on two workers of ``cores`` cores, worker1's tasks ``seconds`` slower
    (unless ``slow`` is false), each training shard held by ``replicas`` executors,
    ``settings`` in place of :data:`SPECULATION` when given, ``extra`` arguments to the job;
    returns the weights, stdout and stderr."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_NO_DAEMONIZE="1",
               PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH"))
                                          if p))
    cluster = StandaloneCluster(tmp_path, workers=2, env=env, hosts=("127.0.0.1", "127.0.0.2"),
                                cores=cores)
    out = tmp_path / "weights.pt"
    settings = {"spark.executor.cores": str(cores),
                **((settings or SPECULATION) if speculation else {}),
                "spark.sparkdl.shardReplicas": str(replicas)}
    confs = [a for k, v in settings.items() for a in ("--conf", f"{k}={v}")]
    try:
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "cluster_job.py"), cluster.url, str(out),
             "--iterations", str(iterations), "--sizes", ",".join(map(str, SIZES)),
             "--warm-executors", "2", "--slow-seconds", str(seconds),
             *(["--slow-executor", "worker1"] if slow else []), *confs, *extra],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    finally:
        cluster.stop()
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("\tat ")]
        pytest.fail(f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n" + "\n".join(lines[-80:]))
    model = SmallNet()
    model.load_state_dict(torch.load(out, weights_only=True))
    return model, proc.stdout, proc.stderr


def train_seconds(stdout: str) -> float:
    return float(re.search(r"train_seconds=([0-9.]+)", stdout).group(1))


@pytest.mark.cluster
def test_a_speculative_copy_fills_the_shard_and_gives_the_clean_weights(sc, tmp_path):
    model, stdout, stderr = run_with_slow_executor(tmp_path, speculation=True)
    assert f"iterations={ITERATIONS}" in stdout
    assert "executors=2" in stdout
    assert copies_started(tmp_path) >= 1, f"Spark started no speculative copy\n{stdout}"
    misses = int(re.search(r"placement_misses=(\d+)", stdout).group(1))
    assert misses >= 1, f"no speculative copy ran where the shard was not\n{stdout}"
    clean, _ = cluster_job.train(sc, sizes=SIZES)
    assert bitwise_equal(model, clean)


def test_speculation_that_can_never_fire_is_warned_about_once_per_fit(sc, caplog):
    """spark.speculation=true on a local master: the fit says, once, that no copy of a slow
    training task can start and why (sparkdl.spark_settings.speculation_never_fires)."""
    from models import classification_data, make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    conf = sc._jsc.sc().conf()         # the running configuration: what the runner reads
    x, y = classification_data(40, seed=1)
    rdd = make_rdd(sc, list(zip(x, y)), [20, 20])
    warned = []
    for speculation in ("true", None):
        if speculation:
            conf.set("spark.speculation", speculation)
        try:
            torch.manual_seed(0)
            net = SmallNet()
            caplog.clear()
            with caplog.at_level("WARNING", logger="sparkdl"):
                DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(),
                                torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                                end_trigger=MaxIteration(1), progress_bar=False).optimize()
            warned.append([r.getMessage() for r in caplog.records
                           if "spark.speculation is true" in r.getMessage()])
        finally:
            conf.remove("spark.speculation")
    assert len(warned[0]) == 1 and "Spark never speculates in local mode" in warned[0][0]
    assert warned[1] == []
