"""Issue 54: large models. No object in the driver's JVM grows with the model (the sums reach
the driver in jobs of a bounded size, broadcasts go in pieces), so a model above the driver's
heap budget trains under a small heap and equals single-process torch; the driver running out
of memory ends a fit with an error naming the driver, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import large_model_job as job
from models import max_abs_diff, reference_train
from rounds_reference import rounds_reference
from sparkdl.data.batch_plan import BatchPlan

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "large_model_job.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=HERE)
    return proc


@pytest.mark.cluster
def test_a_model_above_the_drivers_budget_trains_on_a_small_heap_and_equals_torch(tmp_path):
    """An 80 MiB model (a pass of two: 160 MiB) on a 512m driver heap with
    spark.driver.maxResultSize=16m, which used to refuse it, on local-cluster (a cluster's way:
    on a local master the sums and large broadcasts go as files): a job hands the driver at
    most 8 MiB of sums, every broadcast is at most 32 MiB. The pass's fits and a fit in local
    rounds each equal plain single-process torch within 1e-5."""
    out = tmp_path / "large.pt"
    proc = _run(str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "passes=[[0, 1]]" in proc.stdout
    # the pass's vector and each fit's alone, in jobs within half of maxResultSize
    assert ("the sums of 20 blocks of 7.6 MiB reach the driver in 20 jobs of at most 7.6 MiB"
            in proc.stderr)
    assert "the sums of 10 blocks of 7.6 MiB reach the driver in 10 jobs" in proc.stderr
    saved = torch.load(out, weights_only=True)
    initial = job.make_model()
    initial.load_state_dict(saved["initial"])
    x, y = job.data()
    plan = BatchPlan(job.SIZES, job.BATCH, job.SEED)
    for lr, trained_state in zip([0.005, 0.01], saved["sync"]):
        expected = reference_train(initial, x, y, nn.MSELoss(),
                                   lambda m, lr=lr: torch.optim.SGD(m.parameters(), lr=lr,
                                                                    momentum=0.9),
                                   plan, job.ITERATIONS)
        trained = job.make_model()
        trained.load_state_dict(trained_state)
        assert max_abs_diff(trained, expected) < 1e-5
        assert max_abs_diff(trained, initial) > 1e-4     # it trained: ten times the tolerance
    bounds = np.cumsum([0] + job.SIZES)
    parts = [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    expected = rounds_reference(initial, parts, nn.MSELoss(),
                                lambda m: torch.optim.SGD(m.parameters(), lr=0.005),
                                job.BATCH, job.SEED, job.ROUND_ITERATIONS, 2, "average")
    trained = job.make_model()
    trained.load_state_dict(saved["rounds"])
    assert max_abs_diff(trained, expected) < 1e-5
    # validated at its end: the trained model's mean loss over the data
    with torch.no_grad():
        loss = nn.MSELoss()(trained(torch.from_numpy(x)), torch.from_numpy(y)).item()
    got = float(proc.stdout.split("validation_loss=")[1].split()[0])
    assert abs(got - loss) <= 1e-5 * loss


@pytest.mark.cluster
def test_a_driver_out_of_heap_ends_the_fit_with_an_error_naming_the_driver():
    """A local master's tasks run in the driver's JVM: 160 MB results on a 512m heap run it
    out. Whichever thread runs out first (a task's: Spark's handler exits the JVM; or a
    result-getter thread, which dies and would leave the job waiting forever: seen in about
    one run in four here), the fit ends at once with sparkdl's error naming the driver and the
    setting to raise (it used to rebuild the shards as if an executor had died, then fail with
    py4j's error, or wait forever)."""
    proc = _run("--driver-oom")
    assert "error=DriverMemoryError" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    message = proc.stdout.split("message=")[1].splitlines()[0]
    assert any(where in message for where in ("the driver's JVM", "the driver's result-fetching "
                                              "thread task-result-getter-")), message
    assert "spark.driver.memory" in message
    assert "executor was killed" not in proc.stderr
    assert float(proc.stdout.split("seconds=")[1].split()[0]) < 60


class _Thread:
    def __init__(self, name):
        self.name, self.alive = name, True

    def getName(self):
        return self.name

    def isAlive(self):
        return self.alive


def test_a_dead_result_getter_cancels_the_jobs_and_the_fit_names_the_driver(monkeypatch):
    """Spark's result-getter threads catch only non-fatal errors: one that dies of an
    OutOfMemoryError leaves its job waiting forever. The watch sees a getter thread gone (or a
    number skipped: one started and died between looks), cancels the jobs, and the job's error
    becomes the driver's."""
    from sparkdl.runners import driver_health
    from sparkdl.runners.driver_health import DriverHealth

    monkeypatch.setattr(driver_health, "WATCH_SECONDS", 0.01)
    threads = [_Thread("task-result-getter-0"), _Thread("task-result-getter-1"),
               _Thread("dispatcher-event-loop-0")]
    cancelled = []

    class Thread:
        @staticmethod
        def getAllStackTraces():
            return SimpleNamespace(keySet=lambda: SimpleNamespace(toArray=lambda: list(threads)))

    jvm = SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(Thread=Thread)))
    sc = SimpleNamespace(master="local-cluster[2,1,1024]", _jvm=jvm,
                         cancelAllJobs=lambda: cancelled.append(True))
    health = DriverHealth(sc)
    health.watch()
    import time

    time.sleep(0.2)
    assert not cancelled and health.failure(RuntimeError("Job 3 cancelled")) is None
    threads[1].alive = False                 # getter 1 died of an OutOfMemoryError
    deadline = time.time() + 5
    while not cancelled and time.time() < deadline:
        time.sleep(0.01)
    assert cancelled
    reason = health.failure(RuntimeError("Job 3 cancelled"))
    assert "task-result-getter-1 died" in reason and "spark.driver.memory" in reason
    # a getter started and gone between two looks leaves a gap in the numbers
    later = DriverHealth(sc)
    threads[:] = [_Thread("task-result-getter-0"), _Thread("task-result-getter-2")]
    assert later._find_getters() == ["task-result-getter-1"]
