"""What the README's main job (``examples/lenet_fashion_mnist_engine.py``) prints where its
output is not a terminal (CI, ``spark-submit`` into a log file, ``... 2>&1 | cat``): progress at
a bounded rate, the result, and nothing that looks like a problem."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import pytest

from sparkdl.engine.fit.reports.progress import ConsoleBar, ProgressLog, ProgressReporter
from sparkdl.engine.fit.reports.summary import IterationRecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ALLOWED_WARNINGS = (
    # the JVM (Java 17+) says Spark uses the incubating Vector API module: printed by the JVM
    # itself before any logging is configured, whatever the application does
    "WARNING: Using incubator modules: jdk.incubator.vector",
    # Spark's note of the level it starts its own logging at (no warning: the word is quoted)
    'Setting default log level to "WARN".',
    # Hadoop's native library is not part of pyspark; Hadoop then uses its Java classes, which
    # is what every pip-installed pyspark does
    "WARN NativeCodeLoader: Unable to load native-hadoop library for your platform",
)
"""Lines at WARN or above that the job may print, and why each is no problem."""

ITERATIONS = 40        # 2,560 training images in global batches of 64: one epoch


def run_main_job() -> subprocess.CompletedProcess:
    """The main job as the README runs it (plain ``python``), one epoch on a few images, its
    stdout and stderr merged into a pipe (no TTY, no stdin)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=ROOT,
               # this machine's name may resolve to a loopback address (a WARN about it), and
               # other Spark applications on it may hold the UI's port (a WARN too): neither
               # is the job's, so the job runs bound to 127.0.0.1 without a UI
               SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_SUBMIT_ARGS="--conf spark.ui.enabled=false pyspark-shell")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "lenet_fashion_mnist_engine.py"),
         "--master", "local[2]", "--epochs", "1", "--train-samples", str(ITERATIONS * 64),
         "--batch-size", "64"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=300, env=env, cwd=ROOT)


def test_main_job_without_a_terminal_prints_progress_the_result_and_no_problem():
    proc = run_main_job()
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "test accuracy: " in out, out[-3000:]
    lines = out.splitlines()

    # progress: one line at every tenth of the epoch, not one per iteration
    progress = [line for line in lines if " INFO sparkdl.progress: " in line]
    steps = [int(re.search(r"epoch 1/1 (\d+)/40 ", line).group(1)) for line in progress]
    assert steps == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40], progress
    assert all(re.search(r"loss [0-9.]+  [0-9,]+ samples/s  eta \d+:\d\d$", line)
               for line in progress), progress
    assert not [line for line in lines if re.search(r"iteration \d+ \(\d+/40\): records", line)]
    assert len([line for line in lines if " validation after iteration 40 (epoch 1): "
                "Top1Accuracy " in line]) == 1
    assert len([line for line in lines if " training finished after 40 iterations" in line]) == 1

    # the result, last
    assert re.fullmatch(r"test accuracy: 0\.\d{4}", lines[-1]), lines[-5:]
    assert float(lines[-1].split()[-1]) > 0.5        # trained: chance is 0.1

    # nothing that looks like a problem: py4j's connections closing at exit, Spark's warning
    # for unpersisting the locally checkpointed shards, pyspark's daemon's traceback for each
    # idle worker as the context stops (sparkdl.executor.daemon_exit), or any other warning
    # or error
    assert "Closing down clientserver connection" not in out
    assert "locally checkpointed" not in out
    assert "Traceback" not in out
    problems = [line for line in lines
                if re.search(r"\b(WARN|WARNING|ERROR|FATAL|CRITICAL|Exception)\b", line)
                and not any(allowed in line for allowed in ALLOWED_WARNINGS)]
    assert problems == [], problems


def test_a_daemon_worker_whose_jvm_closed_its_socket_ends_without_a_traceback(monkeypatch):
    """The wrapper quiet_closed_socket_once puts on pyspark.daemon's ``worker``: a broken pipe
    ends the worker with a non-zero code (the daemon's child then exits), anything else is
    raised, a normal return is kept, it wraps once, and outside the daemon it does nothing."""
    import types

    from sparkdl.executor import daemon_exit

    calls = []

    def worker(sock, authenticated):
        calls.append(sock)
        if sock == "closed":
            raise BrokenPipeError(32, "Broken pipe")
        if sock == "bad":
            raise ValueError("not a pipe")
        return 0

    daemon = types.ModuleType("__main__")
    daemon.__spec__ = types.SimpleNamespace(name="pyspark.daemon")
    daemon.worker = worker
    monkeypatch.setitem(sys.modules, "__main__", daemon)
    daemon_exit.quiet_closed_socket_once()
    wrapped = daemon.worker
    assert wrapped is not worker
    assert wrapped("open", True) == 0
    assert wrapped("closed", True) == 1
    with pytest.raises(ValueError, match="not a pipe"):
        wrapped("bad", True)
    daemon_exit.quiet_closed_socket_once()
    assert daemon.worker is wrapped                   # once
    assert calls == ["open", "closed", "bad"]

    driver = types.ModuleType("__main__")
    driver.worker = worker
    monkeypatch.setitem(sys.modules, "__main__", driver)
    daemon_exit.quiet_closed_socket_once()
    assert driver.worker is worker                    # not pyspark's daemon: untouched


def records(n: int, per_epoch: int) -> list[IterationRecord]:
    return [IterationRecord(iteration=i, epoch=(i - 1) // per_epoch + 1, records=64,
                            loss=1.0 / i, learning_rate=0.1, samples_per_s=6400.0, wall_s=0.01,
                            compute_s=0.005, reduce_s=0.001, update_s=0.001, broadcast_s=0.001,
                            other_s=0.002)
            for i in range(1, n + 1)]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_log_is_chosen_where_no_bar_is_drawn():
    def kinds(progress_bar, stream):
        reporter = ProgressReporter(progress_bar, None, 10, 20, 0, stream=stream)
        return [type(s) for s in reporter.sinks]

    assert kinds(None, io.StringIO()) == [ProgressLog]      # not a terminal: log lines
    assert kinds(False, Terminal()) == [ProgressLog]        # bar turned off: log lines
    assert kinds(None, Terminal()) == [ConsoleBar]          # the bar owns the terminal
    assert kinds(True, io.StringIO()) == [ConsoleBar]


def test_progress_log_writes_each_tenth_of_every_epoch_and_after_a_quiet_spell(caplog):
    sink = ProgressLog(235, 470, 0)
    with caplog.at_level(logging.INFO, logger="sparkdl.progress"):
        for record in records(470, 235):
            sink.iteration(record)
    steps = [int(re.search(r" (\d+)/235 ", r.getMessage()).group(1)) for r in caplog.records]
    tenths = [24, 47, 71, 94, 118, 141, 165, 188, 212, 235]
    assert steps == tenths + tenths
    assert caplog.records[9].getMessage().startswith("epoch 1/2 235/235  loss 0.004255 ")
    assert {r.name for r in caplog.records} == {"sparkdl.progress"}

    caplog.clear()
    eager = ProgressLog(235, 470, 0, quiet_s=0.0)   # every iteration is after a quiet spell
    with caplog.at_level(logging.INFO, logger="sparkdl.progress"):
        for record in records(5, 235):
            eager.iteration(record)
    assert len(caplog.records) == 5
