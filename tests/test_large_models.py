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


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """The job in its own driver process; one that runs past ``timeout`` (a hang, in the fit
    or at the process's exit) fails the test with what it printed."""
    try:
        return subprocess.run([sys.executable, os.path.join(HERE, "large_model_job.py"), *args],
                              capture_output=True, text=True, timeout=timeout, cwd=HERE)
    except subprocess.TimeoutExpired as exc:
        def text(out):
            return out.decode(errors="replace") if isinstance(out, bytes) else out or ""
        pytest.fail(f"large_model_job.py {' '.join(args)} ran past {timeout} s: stdout:\n"
                    f"{text(exc.stdout)}\nstderr (end):\n{text(exc.stderr)[-4000:]}")


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
def test_a_model_several_times_each_jvms_heap_share_trains_on_512m_heaps_and_equals_torch(
        tmp_path):
    """A 192 MiB vector on local-cluster with 512m executors and a 512m driver (Spark's memory
    manager lends each about 127 MiB): every record, task result and broadcast piece crossing
    a JVM is at most spark.sparkdl.maxRecordBytes (32m), so nothing in a JVM grows with the
    model. The fit equals plain single-process torch within 1e-5, with and without
    spark.io.encryption.enabled."""
    import small_heaps_job as heaps

    out = tmp_path / "heaps.pt"
    try:
        proc = subprocess.run([sys.executable, os.path.join(HERE, "small_heaps_job.py"),
                               str(out)], capture_output=True, text=True, timeout=600, cwd=HERE)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"small_heaps_job.py ran past 600 s: {str(exc.stderr)[-4000:]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for encrypted in (False, True):
        assert (f"encrypted={encrypted} driver_heap_mib=" in proc.stdout and
                "executor_memory=512m" in proc.stdout), proc.stdout
    heap_mib = float(proc.stdout.split("driver_heap_mib=")[1].split()[0])
    assert heap_mib <= 512                         # the driver's heap is the 512m asked for
    # the vector in blocks of 32 MiB, the sums in jobs of an eighth of the driver's heap beside
    # the weights' pieces its block store may hold (its pool: (512 - 300) x 0.6 = 127 MiB):
    # (512 - 127) / 8 = 48 MiB a job, one block (64 MiB, two blocks, before it was counted)
    assert proc.stderr.count("the sums of 6 blocks of 32.0 MiB reach the driver in 6 jobs of "
                             "at most 32.0 MiB") == 2
    initial = heaps.make_model()
    vector_bytes = sum(p.numel() * 4 for p in initial.parameters())
    assert vector_bytes > 1.5 * (512 - 300) * 0.6 * 2**20       # several times a heap's share
    x, y = heaps.data()
    expected = reference_train(initial, x, y, nn.MSELoss(),
                               lambda m: torch.optim.SGD(m.parameters(), lr=heaps.LR,
                                                         momentum=0.9),
                               BatchPlan(heaps.SIZES, heaps.BATCH, heaps.SEED), heaps.ITERATIONS)
    saved = torch.load(out, weights_only=True)
    for run in ("plain", "encrypted"):
        trained = heaps.make_model()
        trained.load_state_dict(saved[run])
        assert max_abs_diff(trained, expected) < 1e-5, run
        assert max_abs_diff(trained, initial) > 1e-4, run    # it trained: ten times the tolerance


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


@pytest.mark.cluster
def test_a_result_fetching_thread_out_of_heap_ends_the_fit_naming_the_driver():
    """On local-cluster with 2g executors (which hold their 160 MB results easily) and a 512m
    driver, Spark's default settings otherwise: fetching the results runs the driver's heap out
    (its log says so), each result counts as lost and its task runs again, until the results
    sent again pass spark.driver.maxResultSize (it counts every attempt's) or a task has
    failed four times, whichever comes first. The fit ends with sparkdl's error naming the
    driver's result-fetching threads, the heap that filled up and the settings to change, not
    py4j's error and not as an executor's failure."""
    proc = _run("--getter-oom")
    assert "error=DriverMemoryError" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "java.lang.OutOfMemoryError: Java heap space" in proc.stderr   # the mechanism
    message = proc.stdout.split("message=")[1].splitlines()[0]
    assert message.startswith("iteration 1: the driver's result-fetching threads lost the "
                              "tasks' results"), message
    assert "fetching them filled the driver's heap (" in message and "full collections" in message
    assert "spark.driver.memory" in message and "spark.sparkdl.driverJobBytes (400m" in message
    assert "executor was killed" not in proc.stderr and "rebuilding" not in proc.stderr
    assert float(proc.stdout.split("seconds=")[1].split()[0]) < 60


@pytest.mark.cluster
def test_a_driver_jvm_stuck_exiting_mid_fit_is_killed_and_the_fit_ends_naming_the_driver():
    """On local[2], the driver's JVM begins to exit in the middle of a fit's job (Spark's
    handler exits it after an OutOfMemoryError in a task) and a shutdown hook that runs before
    the one stopping the SparkContext never ends: the JVM would never exit, nor the job's call
    return. The watch kills the JVM once it has been exiting for EXIT_GRACE_SECONDS (5 here)
    and the fit ends with sparkdl's error naming the driver's JVM."""
    proc = _run("--stuck-exit")
    assert "exit_error=DriverMemoryError" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    message = proc.stdout.split("exit_message=")[1].splitlines()[0]
    assert "the driver's JVM began to exit" in message and "the watch killed it" in message
    assert "spark.driver.memory" in message
    assert 5 <= float(proc.stdout.split("exit_seconds=")[1].split()[0]) < 20


@pytest.mark.cluster
def test_executors_out_of_heap_end_the_fit_with_the_executors_memory_error():
    """The same job on local-cluster: the executors' JVMs (1g) run out of heap holding 160 MB
    results and exit (code 52); the job itself says only that a checkpoint block is gone. The
    fit asks Spark's status store why the executors were removed, rebuilds once (the limit may
    have been hit by chance), then ends with the executors' memory error naming them, their
    exit code and spark.executor.memory: neither a raw py4j error after three rebuilds nor the
    driver (about 59 s here; it used to take 100-130 s and end in py4j's error)."""
    proc = _run("--executor-oom")
    assert "error=ExecutorMemoryError" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    message = proc.stdout.split("message=")[1].splitlines()[0]
    assert "Command exited with code 52" in message and "spark.executor.memory" in message
    assert "driver" not in message
    assert float(proc.stdout.split("seconds=")[1].split()[0]) < 90


class _Thread:
    def __init__(self, name):
        self.name, self.alive = name, True

    def getName(self):
        return self.name

    def isAlive(self):
        return self.alive

    def getId(self):
        return id(self)


def _watched_sc(threads, exiting=None, pid=4321, proc=None, current=None):
    """A SparkContext's stand-in for what the watch reads: the driver JVM's threads, whether
    it is exiting (``exiting[0]``) and its process id; what the watch did lands in ``done``."""
    done = []
    exiting = exiting if exiting is not None else [False]

    class Thread:
        @staticmethod
        def getAllStackTraces():
            return SimpleNamespace(keySet=lambda: SimpleNamespace(toArray=lambda: list(threads)))

        def __init__(self):
            pass

    def add_hook(hook):
        if exiting[0]:
            raise RuntimeError("java.lang.IllegalStateException: Shutdown in progress")

    runtime = SimpleNamespace(addShutdownHook=add_hook, removeShutdownHook=lambda hook: True)
    jvm = SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(
        Thread=Thread, Runtime=SimpleNamespace(getRuntime=lambda: runtime),
        ProcessHandle=SimpleNamespace(
            current=current or (lambda: SimpleNamespace(pid=lambda: pid))))))
    stopped = []
    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(
        isStopped=lambda: bool(stopped), stop=lambda: (stopped.append(True), done.append("stop"))))
    return SimpleNamespace(master="local-cluster[2,1,1024]", _jvm=jvm, _jsc=jsc,
                           _gateway=SimpleNamespace(proc=proc),
                           cancelAllJobs=lambda: done.append("cancel")), done


def _until(condition, seconds=5.0):
    import time

    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.01)
    return condition()


def _driver_threads():
    return [_Thread("task-result-getter-0"), _Thread("task-result-getter-1"),
            _Thread("dispatcher-event-loop-0"), _Thread("dispatcher-event-loop-1"),
            _Thread("dispatcher-CoarseGrainedScheduler"),
            _Thread("dag-scheduler-event-loop"), _Thread("Executor task launch worker-3")]


@pytest.mark.parametrize("dies, done, words", [
    ("task-result-getter-1", "cancel", "result-fetching thread task-result-getter-1 died"),
    ("dispatcher-event-loop-0", "cancel", "message-loop thread dispatcher-event-loop-0 died"),
    ("dispatcher-CoarseGrainedScheduler", "cancel",
     "scheduler backend's message-loop thread dispatcher-CoarseGrainedScheduler died"),
    ("dag-scheduler-event-loop", "stop", "thread dag-scheduler-event-loop died"),
])
def test_a_dead_driver_thread_ends_the_jobs_and_the_fit_names_the_driver(monkeypatch, dies, done,
                                                                         words):
    """An OutOfMemoryError kills the driver thread it hits, and the driver's JVM has no handler
    for it: a result getter's death loses a task's result, a message loop's a task's status
    (the job waits forever; on a cluster the scheduler backend's own loop delivers them, and a
    thread of the same name replaces it), the DAG scheduler's all jobs' ends (cancelling
    cannot reach them). The watch sees the thread gone: it cancels the jobs, or stops the
    SparkContext for the scheduler's, and the job's error becomes the driver's, naming the
    thread. A thread that died before the fit (a gap in its pool's numbers) is not this fit's."""
    from sparkdl.runners import driver_watch
    from sparkdl.runners.driver_health import DriverHealth

    monkeypatch.setattr(driver_watch, "WATCH_SECONDS", 0.01)
    threads = _driver_threads()
    threads.append(_Thread("task-result-getter-3"))    # getter 2 died before this fit
    sc, did = _watched_sc(threads)
    health = DriverHealth(sc)
    health.watch()
    import time

    time.sleep(0.2)                                    # twenty looks, five of them finding
    assert not did and health.failure(RuntimeError("Job 3 cancelled")) is None
    next(t for t in threads if t.name == dies).alive = False
    assert _until(lambda: did)
    assert did == [done]
    reason = health.failure(RuntimeError("Job 3 cancelled"))
    assert reason.startswith("the driver's ") and words in reason and "OutOfMemoryError" in reason
    assert "spark.driver.memory" in reason
    health.stop()


def test_a_driver_thread_started_and_gone_between_two_looks_leaves_a_gap(monkeypatch):
    """A pool numbers its threads from 0 as they start: a getter that started and died between
    two looks is seen by the number it left out."""
    from sparkdl.runners import driver_watch
    from sparkdl.runners.driver_watch import DriverWatch

    monkeypatch.setattr(driver_watch, "WATCH_SECONDS", 0.01)
    threads = _driver_threads()
    del threads[1]                                     # getter 0 alone so far
    sc, did = _watched_sc(threads)
    watch = DriverWatch(sc)
    watch.start()
    threads.append(_Thread("task-result-getter-2"))    # 1 came and went unseen, then 2
    assert _until(lambda: did)
    assert did == ["cancel"] and "task-result-getter-1 died" in watch.dead


def test_the_watch_has_ended_when_stop_returns(monkeypatch):
    """A daemon thread still logging when the interpreter exits (py4j logs each call into a JVM
    that is gone) holds the logging handler's lock for good, and the interpreter's last
    collection, whose py4j connections log as they close, waits for it forever: seen as a
    driver process that printed the fit's error and never exited. stop() returns once the
    watch's thread has ended."""
    from sparkdl.runners import driver_watch
    from sparkdl.runners.driver_watch import DriverWatch

    monkeypatch.setattr(driver_watch, "WATCH_SECONDS", 0.05)
    sc, did = _watched_sc(_driver_threads())
    watch = DriverWatch(sc)
    watch.start()
    import time

    time.sleep(0.12)
    assert watch._watcher.is_alive()
    watch.stop()
    assert not watch._watcher.is_alive() and not did


def test_a_driver_jvm_that_cannot_be_looked_at_is_not_watched(monkeypatch):
    """A watch whose first looks fail (here the JVM's process id) does not run: a watch that
    knew no threads would take the DAG scheduler's for dead and stop a healthy context."""
    from sparkdl.runners import driver_watch
    from sparkdl.runners.driver_watch import DriverWatch

    monkeypatch.setattr(driver_watch, "WATCH_SECONDS", 0.01)

    def current():
        raise RuntimeError("py4j.Py4JException: Method current([]) does not exist")

    sc, did = _watched_sc(_driver_threads(), current=current)
    watch = DriverWatch(sc)
    watch.start()
    import time

    time.sleep(0.1)
    assert not watch.running and not did and watch.dead is None


def test_a_fit_ending_while_its_driver_jvm_exits_waits_for_it_and_kills_it_when_stuck(
        monkeypatch):
    """The fit's error can come before the watch has seen the JVM through its exit (Spark's
    shutdown hook fails the jobs first): stop() sees it out, killing a JVM of the driver's
    own that is still exiting after EXIT_GRACE_SECONDS, so that no fit leaves one behind."""
    import time

    from sparkdl.runners import driver_watch
    from sparkdl.runners.driver_watch import DriverWatch

    monkeypatch.setattr(driver_watch, "WATCH_SECONDS", 0.01)
    monkeypatch.setattr(driver_watch, "EXIT_GRACE_SECONDS", 0.3)
    killed = []
    proc = SimpleNamespace(pid=4321, poll=lambda: None, kill=lambda: killed.append("proc"))
    exiting = [False]
    sc, did = _watched_sc(_driver_threads(), exiting, pid=4321, proc=proc)
    watch = DriverWatch(sc)
    watch.start()
    exiting[0] = True
    began = time.monotonic()
    watch.stop()
    assert time.monotonic() - began >= 0.25 and killed == ["proc"]
    assert "the watch killed it" in watch.dead and not watch._watcher.is_alive()


@pytest.mark.parametrize("ours", ["started", "parent", "other"])
def test_a_driver_jvm_stuck_exiting_is_killed_so_that_the_fit_ends(monkeypatch, ours):
    """Spark exits the driver's JVM after an OutOfMemoryError in a task (on a local master the
    tasks run in it): a shutdown hook that blocks keeps it exiting forever, and every call into
    it waits. The watch kills a JVM still exiting after EXIT_GRACE_SECONDS, when it is the
    driver's own (started by this Python process, or its parent under spark-submit); any
    other JVM it leaves alone, saying so. The fit's error then names the driver's JVM."""
    import signal

    from sparkdl.runners import driver_watch
    from sparkdl.runners.driver_health import DriverHealth

    monkeypatch.setattr(driver_watch, "WATCH_SECONDS", 0.01)
    monkeypatch.setattr(driver_watch, "EXIT_GRACE_SECONDS", 0.3)
    killed = []
    monkeypatch.setattr(driver_watch.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(driver_watch.os, "getppid", lambda: 4321 if ours == "parent" else 1)
    proc = SimpleNamespace(pid=4321 if ours == "started" else 99, poll=lambda: None,
                           kill=lambda: killed.append("proc"))
    exiting = [False]
    sc, did = _watched_sc(_driver_threads(), exiting, pid=4321, proc=proc)
    health = DriverHealth(sc)
    health.watch()
    import time

    time.sleep(0.1)
    exiting[0] = True
    time.sleep(0.15)
    assert not killed                                  # within the grace: Spark's hooks run
    assert _until(lambda: health._watch.dead is not None)
    assert killed == {"started": ["proc"], "parent": [(4321, signal.SIGKILL)], "other": []}[ours]
    reason = health.failure(ConnectionRefusedError(111, "Connection refused"))
    assert reason.startswith("the driver's JVM began to exit"), reason
    assert ("the watch killed it" in reason) == (ours != "other")
    assert not did                                     # neither cancelled nor stopped


class _JavaError(Exception):
    """A py4j error whose text lives in a JVM that is gone (py4j fetches it on str())."""

    def __str__(self):
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_job_error_whose_text_went_with_the_drivers_jvm_still_names_the_driver():
    """A Java exception's text is fetched from the driver's JVM when printed: after Spark exited
    that JVM (an OutOfMemoryError in a task on a local master) it cannot be had. The fit's
    error still names the driver's JVM and its exit code, and the cleanup's warning says what
    it can instead of raising in place of the fit's error."""
    from sparkdl.errors import exception_text
    from sparkdl.runners.driver_health import DriverHealth

    assert exception_text(_JavaError()) == ("_JavaError (its text was in the driver's JVM, "
                                            "which is gone)")
    exited = SimpleNamespace(poll=lambda: 52, wait=lambda timeout: 52)
    sc, _ = _watched_sc(_driver_threads(), proc=exited)
    reason = DriverHealth(sc).failure(_JavaError())
    assert reason.startswith("the driver's JVM exited with code 52 after an OutOfMemoryError")
    assert "spark.driver.memory" in reason


def _conf_sc(settings: dict[str, int], peak: tuple[int, int], full: list[int] | None = None,
             heap: int = 512 * 2**20):
    """A SparkContext's stand-in for what DriverHealth reads: settings (sizes in bytes), the
    heap's pools (G1's: the old generation's peak ``peak``, used and limit) and its collectors
    (``full[0]``: how many full collections so far)."""
    full = full if full is not None else [0]
    conf = SimpleNamespace(getSizeAsBytes=lambda key, default: settings.get(key, 2**30),
                           get=lambda key, default="": str(settings.get(key, default)))
    runtime = SimpleNamespace(maxMemory=lambda: heap)

    def pool(name, used, limit, kind="Heap memory"):
        usage = SimpleNamespace(getUsed=lambda: used, getMax=lambda: limit)
        return SimpleNamespace(getName=lambda: name,
                               getType=lambda: SimpleNamespace(toString=lambda: kind),
                               getUsage=lambda: usage, getPeakUsage=lambda: usage)

    pools = [pool("G1 Eden Space", 60 << 20, -1), pool("G1 Old Gen", *peak),
             pool("Metaspace", 90 << 20, -1, "Non-heap memory")]
    collectors = [SimpleNamespace(getName=lambda: "G1 Young Generation",
                                  getCollectionCount=lambda: 50),
                  SimpleNamespace(getName=lambda: "G1 Old Generation",
                                  getCollectionCount=lambda: full[0])]
    management = SimpleNamespace(ManagementFactory=SimpleNamespace(
        getMemoryPoolMXBeans=lambda: pools, getGarbageCollectorMXBeans=lambda: collectors))
    jvm = SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(
        Runtime=SimpleNamespace(getRuntime=lambda: runtime), management=management)))
    return SimpleNamespace(master="local-cluster[2,1,2048]", _jvm=jvm, _gateway=None,
                           _jsc=SimpleNamespace(sc=lambda: SimpleNamespace(
                               conf=lambda: conf, isStopped=lambda: False)))


def test_results_lost_on_the_way_to_the_driver_are_the_drivers_memory_when_its_heap_filled():
    """A fetch of a result too large for the driver's free heap fails without killing the
    result-getter thread: Spark counts the result as lost and runs the task again. Both ways
    that job ends (a task failed spark.task.maxFailures times; the results sent again passing
    spark.driver.maxResultSize, which no job of a fit reaches alone) name the driver's
    result-fetching threads when the heap's old generation peaked near its limit during the
    fit, and keep the job's own error when it did not (a block manager out of reach); a
    maxResultSize that the user's spark.sparkdl.driverJobBytes lets one job pass is said to
    be that."""
    from sparkdl.runners.driver_health import DriverHealth

    lost = RuntimeError("org.apache.spark.SparkException: Job aborted due to stage failure: "
                        "Task 1 in stage 1.0 failed 4 times, most recent failure: Lost task 1.3 "
                        "in stage 1.0 (TID 8) (127.0.0.1 executor 0): TaskResultLost (result "
                        "lost from block manager)\n\tat org.apache.spark.Foo")
    above = RuntimeError("Job aborted due to stage failure: Total size of serialized results "
                         "of 7 tasks (1073.1 MiB) is bigger than spark.driver.maxResultSize "
                         "(1024.0 MiB)")
    full = DriverHealth(_conf_sc({"spark.driver.maxResultSize": 2**30}, (436 << 20, 512 << 20)))
    reason = full.failure(lost)
    assert reason.startswith("the driver's result-fetching threads lost the tasks' results: "
                             "org.apache.spark.SparkException: Job aborted"), reason
    assert "its largest pool peaking at 436 of 512 MiB during the fit" in reason
    assert "spark.driver.memory" in reason and "driverJobBytes" not in reason
    reason = full.failure(above)
    assert reason.startswith("the driver's result-fetching threads lost the tasks' results and "
                             "the results sent again passed the limit"), reason
    assert "at most 64 MiB each" in reason       # an eighth of 512 MiB: the fit's own jobs
    # full collections of the heap during the fit are the evidence too (a humongous result
    # fails to be allocated with the old generation at 72%: seen on a 512m heap)
    full_gcs = [3]
    collected = DriverHealth(_conf_sc({"spark.driver.maxResultSize": 2**30},
                                      (370 << 20, 512 << 20), full_gcs))
    collected.watch()
    collected.stop()
    assert collected.failure(lost) is None           # none since the watch started
    full_gcs[0] = 20
    assert "(17 full collections of its heap, its largest pool peaking at 370 of 512 MiB " \
           "during the fit;" in collected.failure(lost)
    # the heap never filled: not the driver's memory (a block manager the driver cannot reach)
    calm = DriverHealth(_conf_sc({"spark.driver.maxResultSize": 2**30}, (300 << 20, 512 << 20)))
    assert calm.failure(lost) is None and calm.failure(above) is None
    chosen = DriverHealth(_conf_sc({"spark.driver.maxResultSize": 2**30,
                                    "spark.sparkdl.driverJobBytes": 2**31},
                                   (300 << 20, 512 << 20)))
    reason = chosen.failure(above)
    assert "spark.sparkdl.driverJobBytes (2048 MiB) lets one job hand the driver more than " \
           "spark.driver.maxResultSize (1024 MiB)" in reason, reason
    # the setting named when it made the jobs larger than an eighth of the heap
    big_jobs = DriverHealth(_conf_sc({"spark.driver.maxResultSize": 2**30,
                                      "spark.sparkdl.driverJobBytes": 400 << 20},
                                     (436 << 20, 512 << 20)))
    assert "or lower spark.sparkdl.driverJobBytes (419430400;" in big_jobs.failure(lost)
    # an executor's failure is not the driver's
    assert full.failure(RuntimeError("ExecutorLostFailure (executor 1 exited caused by one "
                                     "of the running tasks)")) is None


class _TableNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(20, 4, sparse=True)
        self.head = nn.Linear(4, 3)
        self.unused = nn.Linear(2, 2)          # gets no gradient

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids))


def test_a_task_drops_each_dense_gradient_once_it_is_in_the_vector():
    """A task holds the gradients once: each dense gradient leaves the model as soon as it is
    copied into the vector (at a model's size, the vector and the gradients were two copies at
    once), the same vector and presence as before; the tables' gradients stay for their rows."""
    from sparkdl.transport.flat_layout import ParamLayout

    torch.manual_seed(0)
    net = _TableNet()
    layout = ParamLayout(net)
    net(torch.tensor([1, 5, 5, 7])).sum().backward()
    kept, kept_present = layout.gradients(net)
    assert all(p.grad is not None for n, p in net.named_parameters() if "unused" not in n)
    vector, present = layout.gradients(net, release=True)
    assert vector.tobytes() == kept.tobytes() and present.tolist() == kept_present.tolist()
    assert present.tolist() == [1, 1, 1, 0, 0]
    grads = {n: p.grad for n, p in net.named_parameters()}
    assert grads["head.weight"] is None and grads["head.bias"] is None
    assert grads["table.weight"] is not None and grads["table.weight"].is_sparse
    assert layout.table_rows(net)[0][0].tolist() == [1, 5, 7]       # the table's rows


def test_a_tasks_vector_is_its_gradients_themselves_cut_into_the_same_blocks(tmp_path):
    """A task alone on its share sends its gradients as they are (no vector copied from them:
    the task held a gradient and a half beside the weights while it copied): the same values,
    presence, blocks and map file as the copied vector, each dense segment the gradient's own
    memory, the tables' and the absent parameters' zeros."""
    from sparkdl.transport.allreduce import ShuffleMapSide, block_bounds
    from sparkdl.transport.codecs import ExactCodec
    from sparkdl.transport.flat_layout import ParamLayout
    from sparkdl.transport.segmented_vector import (SegmentedVector, copy_vector_into,
                                                    write_vector)

    torch.manual_seed(0)
    net = _TableNet()
    layout = ParamLayout(net)
    net(torch.tensor([1, 5, 5, 7])).sum().backward()
    kept, kept_present = layout.gradients(net)
    head_grad = net.head.weight.grad
    vector, present = layout.gradients(net, release=True, segmented=True)
    assert isinstance(vector, SegmentedVector) and vector.size == kept.size == layout.size
    assert np.asarray(vector).tobytes() == kept.tobytes()
    assert present.tolist() == kept_present.tolist() == [1, 1, 1, 0, 0]
    assert net.head.weight.grad is None and net.table.weight.grad is not None   # rows stay
    head = layout.params[1]
    assert np.shares_memory(vector[head.start:head.stop], head_grad.numpy())
    for lo in range(0, kept.size + 1):
        for hi in range(lo, kept.size + 1):
            assert vector[lo:hi].tobytes() == kept[lo:hi].tobytes(), (lo, hi)
    into = np.full(kept.size, np.nan, dtype=kept.dtype)
    copy_vector_into(into, vector)
    assert into.tobytes() == kept.tobytes()
    with open(tmp_path / "v", "wb") as out:
        write_vector(out, vector)
    assert (tmp_path / "v").read_bytes() == kept.tobytes()
    # the shuffle's map side: the same frames (blocks across the segments' ends), the same file
    codec = ExactCodec(kept.dtype)
    report = SimpleNamespace(partition=0)
    for blocks in (1, 3, 7):
        bounds = block_bounds(kept.size, blocks)
        side = ShuffleMapSide(None, bounds, blocks, codec, {}, frame_bytes=8)
        assert [bytes(f) for f in side.emit(0, vector, report)] == \
               [bytes(f) for f in side.emit(0, kept, report)]
    files = ShuffleMapSide(None, block_bounds(kept.size, 3), 3, codec, {}, str(tmp_path))
    list(files.emit(0, vector, report))
    list(files.emit(1, kept, report))
    written = {p.name.split("-")[1]: p.read_bytes() for p in tmp_path.glob("map-*")}
    assert written["0"] == written["1"] == kept.tobytes()


def test_a_models_weights_ship_out_of_band_and_the_task_builds_it_on_the_received_bytes():
    """The replica's spec ships its large tensors' bytes out of band (pickle 5): the driver
    copies none of them, the task rebuilds the model on the buffers it received (the weights
    once in the worker, not three times), and the model is the same: values, dtypes, tied
    weights, views of one buffer, parameters and ``requires_grad``, functions beside it."""
    import pickle

    from sparkdl.transport.pieced_broadcast import pieced_broadcast
    from sparkdl.transport.tensor_buffers import OutOfBand, dumps_out_of_band

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(512, 1024)
            self.frozen = nn.Linear(1024, 512)
            self.frozen.weight.requires_grad_(False)
            self.emb = nn.Embedding(1000, 512)
            self.head = nn.Linear(512, 1000, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("steps", torch.arange(300_000, dtype=torch.float64))
            self.register_buffer("window", self.steps[10:20])
            self.halves = nn.Parameter(torch.ones(1 << 20, dtype=torch.bfloat16))

    torch.manual_seed(0)
    model = Tied()
    shipped = dumps_out_of_band({"model": model, "scale": lambda v: 2 * v})
    storages = {model.a.weight.untyped_storage().data_ptr(),
                model.emb.weight.untyped_storage().data_ptr()}
    assert storages <= {b.ctypes.data for b in shipped.buffers}   # views: nothing copied
    assert len(shipped.stream) < 100_000 and len(shipped.buffers) == 5    # tied: one
    handle = pieced_broadcast(lambda v: SimpleNamespace(value=v), shipped, piece_bytes=1 << 20)
    received = handle.value
    assert isinstance(received, OutOfBand)
    got = received.load()
    twin = got["model"]
    assert got["scale"](3) == 6
    on = {b.ctypes.data for b in received.buffers}
    assert {twin.a.weight.untyped_storage().data_ptr(),
            twin.steps.untyped_storage().data_ptr()} <= on     # on the received bytes
    want = model.state_dict(keep_vars=True)
    for name, tensor in twin.state_dict(keep_vars=True).items():
        assert type(tensor) is type(want[name]) and tensor.dtype == want[name].dtype, name
        assert tensor.requires_grad == want[name].requires_grad, name
        assert torch.equal(tensor, want[name]), name
    assert twin.head.weight is twin.emb.weight
    twin.steps[12] = -1.0
    assert twin.window[2] == -1.0                   # still a view of the same buffer
    # a second load of the same received value (a second replica in the worker, a cached
    # broadcast), or a load of the driver's own, is a model of its own memory
    for again in (received.load()["model"], shipped.load()["model"]):
        assert torch.equal(again.a.weight, model.a.weight)
        assert again.a.weight.untyped_storage().data_ptr() not in on | storages
        assert again.head.weight is again.emb.weight
    # a small value's broadcast carries it in band (read-only bytes): its own copies
    small = pickle.loads(pickle.dumps(shipped, protocol=5)).load()["model"]
    assert small.a.weight.untyped_storage().data_ptr() not in storages
    assert torch.equal(small.a.weight, model.a.weight)
    before = model.a.weight.detach().clone()
    small.a.weight.data.add_(1.0)                   # writable, and not the driver's memory
    assert torch.equal(model.a.weight, before)


def test_the_driver_lets_go_of_an_iterations_sums_before_the_next_job():
    """The driver holds one iteration's sums at a time: the completions of a job (each holding
    its fit's summed vector) are dropped before the next job collects its own (two sums beside
    the weights, for a model of the machine's size, was a copy too many)."""
    import gc
    import weakref

    from sparkdl.engine.strategies.base import FitsDriver

    class Sums:
        pass

    alive: list[list[bool]] = []

    class Jobs:
        jobs = 0
        last: list = []

        def starting(self, active):
            pass

        def iteration(self, active):
            gc.collect()
            alive.append([ref() is not None for ref in self.last])
            self.jobs += 1
            sums = {k: Sums() for k in active}
            self.last = [weakref.ref(v) for v in sums.values()]
            return {k: (lambda k=k, result=sums[k]: self.jobs >= 3) for k in active}

    member = SimpleNamespace(start=lambda: True, close=lambda: None,
                             ctx=SimpleNamespace(iteration=3))
    driver = FitsDriver([member, member], Jobs(), "pass").run()
    assert driver.finished == {0, 1} and alive == [[], [False, False], [False, False]]


def test_the_drivers_parameters_are_the_state_it_ships_and_step_as_torchs():
    """The driver holds the weights once: the model's parameters become views of the state
    vector that is broadcast (their identity kept, so the optimizer still holds them), an
    optimizer step writes the state in place, and the state and weights are bitwise those of
    an unbound model stepping the same gradients; the row-local tables and a reset (a closure
    optimizer's trial weights) are handled."""
    from sparkdl.transport.flat_layout import ParamLayout
    from sparkdl.transport.weight_refresh import DriverWeights

    torch.manual_seed(1)
    bound_net = _TableNet()
    plain_net = _TableNet()
    plain_net.load_state_dict(bound_net.state_dict())
    layout = ParamLayout(bound_net)
    ids = [p for p in bound_net.parameters()]
    bound = DriverWeights(layout, bound_net, [0], bind=True)
    plain = DriverWeights(layout, plain_net, [0])
    assert [p for p in bound_net.parameters()] == ids              # the same parameters
    params = dict(bound_net.named_parameters())
    assert not np.shares_memory(params["table.weight"].detach().numpy(), bound.state)
    for name in ("head.weight", "head.bias", "unused.weight"):
        assert np.shares_memory(params[name].detach().numpy(), bound.state)
    assert bound.state.tobytes() == plain.state.tobytes()
    opts = [torch.optim.SGD(n.parameters(), lr=0.1, momentum=0.9)
            for n in (bound_net, plain_net)]
    for step in range(3):
        for net, opt in zip((bound_net, plain_net), opts):
            opt.zero_grad()
            net(torch.tensor([step, 3, 9])).pow(2).sum().backward()
            opt.step()
        rows = {0: (np.array([step, 3, 9]), np.zeros((3, 4), np.float32))}
        got, want = bound.advance(bound_net, rows), plain.advance(plain_net, rows)
        assert got.state.tobytes() == want.state.tobytes()
        assert all(torch.equal(a, b) for a, b in zip(bound_net.parameters(),
                                                     plain_net.parameters()))
    # a parameter that is a view of a larger tensor of the user's stays tied to it
    flat = torch.zeros(10)
    tied = nn.Linear(2, 2)
    tied.weight = nn.Parameter(flat[:4].view(2, 2))
    tied_layout = ParamLayout(tied)
    tied_weights = DriverWeights(tied_layout, tied, [], bind=True)
    assert tied.weight.data_ptr() == flat.data_ptr()
    assert np.shares_memory(tied.bias.detach().numpy(), tied_weights.state)
    # a parameter whose data another tensor can see keeps it (a state_dict taken before
    # follows training); one not contiguous too (its memory format is the user's)
    aliased = nn.Linear(2, 2)
    held = aliased.state_dict()
    aliased.bias = nn.Parameter(torch.zeros(4)[::2])
    assert DriverWeights(ParamLayout(aliased), aliased, [], bind=True)._bound == set()
    assert held["weight"].data_ptr() == aliased.weight.data_ptr()
    del held
    assert DriverWeights(ParamLayout(aliased), aliased, [], bind=True)._bound == {0}
    # code that replaces a parameter's data unbinds it: the state copies it from then on
    replaced = nn.Linear(3, 2)
    replaced_weights = DriverWeights(ParamLayout(replaced), replaced, [], bind=True)
    assert replaced_weights._bound == {0, 1}
    torch.nn.utils.vector_to_parameters(torch.arange(8.0), replaced.parameters())
    got = replaced_weights.advance(replaced, None)
    assert got.state.tobytes() == ParamLayout(replaced).state_vector(replaced).tobytes()
    assert replaced_weights._bound == set()
    old = bound.state
    bound.reset(bound_net)
    assert bound.state is not old
    assert bound.state.tobytes() == layout.state_vector(bound_net).tobytes()
    assert np.shares_memory(params["head.weight"].detach().numpy(), bound.state)


def test_a_read_value_can_be_forgotten_and_read_again_under_threads(tmp_path):
    """A task drops the weights' (or model's) bytes once they are in its model; another thread
    of the task still gets the whole value, read again where needed, never None."""
    import threading

    from sparkdl.transport.pieced_broadcast import pieced_broadcast

    value = {"w": np.arange(40_000, dtype=np.float32)}
    handle = pieced_broadcast(lambda v: None, value, piece_bytes=1 << 10, local_dir=str(tmp_path))
    first = handle.value
    handle.forget()
    assert handle._value is None
    again = handle.value
    assert again is not first and again["w"].tobytes() == value["w"].tobytes()
    bad = []

    def read() -> None:
        for _ in range(200):
            got = handle.value
            if got is None or got["w"][-1] != 39_999:
                bad.append(got)
            handle.forget()

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    handle.destroy()


def test_a_python_worker_killed_in_every_attempt_ends_the_fit_naming_memory(sc):
    """A task's Python worker killed without a Python error (what the machine's out-of-memory
    killer does to the largest process) ends the fit at once with the memory error, not a raw
    Spark error and no rebuild of the shards."""
    import signal
    import time

    from models import SmallNet, classification_data, make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.engine.fit.recovery import ExecutorMemoryError
    from sparkdl.triggers import MaxIteration

    def killed_in_tasks(out, y):
        from pyspark import TaskContext

        if TaskContext.get() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return nn.functional.cross_entropy(out, y)

    x, y = classification_data(40, seed=2)
    net = SmallNet()
    fit = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [20, 20]), killed_in_tasks,
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                          end_trigger=MaxIteration(2), seed=1, progress_bar=False)
    started = time.time()
    with pytest.raises(ExecutorMemoryError, match=r"iteration 1: a task's Python worker died.*"
                                                  r"spark\.executor\.pyspark\.memory"):
        fit.optimize()
    assert time.time() - started < 60


def test_a_synchronous_fit_holds_the_weights_once_and_equals_torch():
    """In a fit the driver's parameters are the shipped state (not torch's own memory any more)
    and the result equals single-process torch; with LBFGS (a closure) they stay torch's."""
    from models import SmallNet, classification_data
    from sparkdl import DistriOptimizer
    from sparkdl.runners import LocalPartitions
    from sparkdl.triggers import MaxIteration

    x, y = classification_data(40, seed=4)
    records = list(zip(x, y))
    torch.manual_seed(3)
    net = SmallNet()
    ref = SmallNet()
    ref.load_state_dict(net.state_dict())
    fit = DistriOptimizer(net, LocalPartitions([records[:20], records[20:]]),
                          nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                          batch_size=8, end_trigger=MaxIteration(4), seed=1, progress_bar=False)
    fit.optimize()
    # bound: each parameter is a view of one uint8 state vector (numpy's memory, in order)
    ptrs = [p.data_ptr() for p in net.parameters()]
    assert ptrs == sorted(ptrs) and ptrs[-1] - ptrs[0] < 2 * sum(
        p.numel() * 4 for p in net.parameters())
    want = reference_train(ref, x, y, nn.CrossEntropyLoss(),
                           lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                           BatchPlan([20, 20], 8, 1), 4)
    assert max_abs_diff(net, want) < 1e-6
    assert max_abs_diff(net, ref) > 1e-3           # it trained
    closure_net = SmallNet()
    before = [p.data_ptr() for p in closure_net.parameters()]
    DistriOptimizer(closure_net, LocalPartitions([records[:20], records[20:]]),
                    nn.CrossEntropyLoss(), torch.optim.LBFGS(closure_net.parameters(), lr=0.1),
                    batch_size=8, end_trigger=MaxIteration(1), seed=1,
                    progress_bar=False).optimize()
    assert [p.data_ptr() for p in closure_net.parameters()] == before     # not rebound
