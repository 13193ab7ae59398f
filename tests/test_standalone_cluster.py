"""A real Spark standalone cluster on 127.0.0.1: a master and workers started with
``spark-class`` from the pyspark package, and everything torn down (the cluster class is shared
with tests/test_shipping.py, which submits jobs whose executors lack sparkdl); executors joining
and leaving under dynamic allocation.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_under(path: str) -> list[str]:
    """Live processes whose command line or working directory mention ``path``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if path in cmd or cwd.startswith(path):
            found.append(f"{pid}: {cmd[:200]}")
    return found


class StandaloneCluster:
    """A master and workers as child process groups; :meth:`stop` kills the groups."""

    def __init__(self, tmp, workers: int, env: dict[str, str],
                 hosts: tuple[str, ...] = (), cores: int = 1) -> None:
        import pyspark

        self.spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
        self.tmp, self.env, self.procs, self.cores = tmp, env, [], cores
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(free_port()))
        self.workers: dict[int, subprocess.Popen] = {}
        for i in range(workers):
            self.add_worker(i, wait=False, host=hosts[i] if i < len(hosts) else "127.0.0.1")
        self._wait_for_workers(workers)

    def add_worker(self, i: int, wait: bool = True, host: str = "127.0.0.1") -> None:
        """Start worker ``i`` (``cores`` cores, work directory ``tmp/worker<i>``) on ``host`` (another
        loopback address, 127.0.0.2, makes it another host to Spark's scheduler)."""
        work = self.tmp / f"worker{i}"
        work.mkdir()
        self.workers[i] = self._start(
            f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host",
            host, "--cores", str(self.cores), "--memory", "1536m", "--webui-port", str(free_port()),
            "--work-dir", str(work))
        if wait:
            self._wait_for_workers(len(self.workers))

    def stop_worker(self, i: int) -> None:
        """Stop worker ``i`` and the executors it runs (SIGTERM to its process group)."""
        proc = self.workers[i]
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)

    def _start(self, name: str, cls: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen([self.spark_class, cls, *args], stdout=log,
                                stderr=subprocess.STDOUT, env=self.env, cwd=self.tmp,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait_for_workers(self, count: int, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            log = (self.tmp / "master.log").read_text()
            if log.count("Registering worker") >= count:
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("standalone cluster did not start:\n" +
                           (self.tmp / "master.log").read_text()[-3000:])

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.time() + 30
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _holds_shards(work) -> bool:
    """Whether an executor under this worker directory built shards."""
    return any((work / app / ex / "sparkdl-shards").is_dir()
               for app in os.listdir(work) for ex in os.listdir(work / app))


def _wait_for(what: str, condition, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.cluster
def test_executors_join_and_leave_under_dynamic_allocation(sc, tmp_path):
    """Dynamic allocation (shuffle tracking) on a standalone cluster: a third worker joins
    mid-training and gets an executor that takes tasks, then one of the first workers is
    stopped with its executor; the run completes bitwise equal to a clean run."""
    import cluster_job
    import torch

    from models import SmallNet, bitwise_equal

    iterations, sizes = 20, [30, 20, 25, 15, 30, 20, 10, 25]
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_NO_DAEMONIZE="1",
               PYTHONPATH=os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH"))
                                          if p))
    cluster = StandaloneCluster(tmp_path, workers=2, env=env)
    out, err_path = tmp_path / "weights.pt", tmp_path / "driver.err"
    try:
        settings = {"spark.dynamicAllocation.enabled": "true",
                    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
                    "spark.dynamicAllocation.initialExecutors": "2",
                    "spark.dynamicAllocation.minExecutors": "1",
                    "spark.dynamicAllocation.maxExecutors": "3",
                    "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
                    "spark.dynamicAllocation.sustainedSchedulerBacklogTimeout": "1s",
                    "spark.executor.cores": "1"}
        confs = [a for k, v in settings.items() for a in ("--conf", f"{k}={v}")]
        with open(err_path, "w") as err:
            driver = subprocess.Popen(
                [sys.executable, os.path.join(tests, "cluster_job.py"), cluster.url, str(out),
                 "--iterations", str(iterations), "--slow-partition", "-1",
                 "--sizes", ",".join(map(str, sizes)),
                 "--locality-wait", "0", *confs],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=tmp_path)
            try:
                _wait_for("training to start",
                          lambda: " sparkdl.progress " in err_path.read_text() or
                          driver.poll() is not None)
                cluster.add_worker(2)
                # an executor launched on the new worker and took tasks (it holds shards);
                # the worker to be stopped has an executor that holds shards too
                for worker in (2, 0):
                    _wait_for(f"an executor holding shards on worker {worker}",
                              lambda: _holds_shards(tmp_path / f"worker{worker}") or
                              driver.poll() is not None)
                assert driver.poll() is None, "training ended before a worker joined"
                cluster.stop_worker(0)
                assert driver.poll() is None, "training ended before a worker left"
                stdout, _ = driver.communicate(timeout=600)
            finally:
                if driver.poll() is None:
                    driver.kill()
        stderr = err_path.read_text()
        assert driver.returncode == 0, stderr[-4000:]
    finally:
        cluster.stop()
    assert f"iterations={iterations}" in stdout
    assert "Lost executor" in stderr          # the stopped worker's executor
    model = SmallNet()
    model.load_state_dict(torch.load(out, weights_only=True))
    clean, _ = cluster_job.train(sc, iterations=iterations, sizes=sizes)
    assert bitwise_equal(model, clean)
