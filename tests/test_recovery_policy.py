"""The recovery policy against the failure messages Spark's cluster managers write (issue: real
clusters, acceptance 5): a lost executor is rebuilt; one killed for memory is rebuilt once, then
reported as a memory problem naming the settings to raise."""

from __future__ import annotations

import pytest

from sparkdl.runners.driver_health import driver_heap_failure

from sparkdl.engine.fit.recovery import (MAX_REBUILDS, ExecutorMemoryError, ExecutorsLostError,
                                         run_with_recovery)
from sparkdl.runners.cached_rdd import lost_data_reason, memory_kill_reason

YARN_MEMORY = ("Job aborted due to stage failure: Task 3 in stage 7.0 failed 4 times, most recent "
               "failure: Lost task 3.3 in stage 7.0 (TID 41) (node-4 executor 5): "
               "ExecutorLostFailure (executor 5 exited caused by one of the running tasks) "
               "Reason: Container killed by YARN for exceeding physical memory limits. 6.6 GB of "
               "6.6 GB physical memory used. Consider boosting spark.executor.memoryOverhead.")
K8S_MEMORY = ("Lost task 0.0 in stage 3.0 (TID 5) (10.1.2.3 executor 2): ExecutorLostFailure "
              "(executor 2 exited caused by one of the running tasks) Reason: The executor with "
              "id 2 exited with exit code 137(SIGKILL, possible container OOM).")
LOST = ("Lost task 1.0 in stage 4.0 (TID 9) (127.0.0.1 executor 1): ExecutorLostFailure "
        "(executor 1 exited caused by one of the running tasks) Reason: Command exited with "
        "code 137")


class FakeRunner:
    """Fails the job with the given messages, one per run, then succeeds."""

    def __init__(self, *messages):
        self.messages = list(messages)
        self.rebuilds = 0

    def job(self):
        if self.messages:
            raise RuntimeError(self.messages.pop(0))
        return "result"

    lost_data_reason = staticmethod(lost_data_reason)
    memory_kill_reason = staticmethod(memory_kill_reason)
    driver_failure = staticmethod(driver_heap_failure)

    def rebuild(self, data, reason):
        self.rebuilds += 1


class Data:
    name = "training"


def run(runner):
    return run_with_recovery(runner, Data(), runner.job, lambda r: [], "iteration 8")


@pytest.mark.parametrize("message", [YARN_MEMORY, K8S_MEMORY])
def test_a_second_memory_kill_names_memory_and_the_settings(message):
    runner = FakeRunner(message, message)
    with pytest.raises(ExecutorMemoryError, match=r"iteration 8: an executor was killed for "
                                                  r"exceeding its memory limit twice.*"
                                                  r"spark\.executor\.memoryOverhead.*"
                                                  r"spark\.executor\.pyspark\.memory"):
        run(runner)
    assert runner.rebuilds == 1                    # at most one futile rebuild


def test_one_memory_kill_is_rebuilt_once_and_training_goes_on(caplog):
    runner = FakeRunner(K8S_MEMORY)
    with caplog.at_level("WARNING", logger="sparkdl"):
        assert run(runner) == "result"
    assert runner.rebuilds == 1
    assert any("killed for exceeding its memory" in r.getMessage() for r in caplog.records)


def test_a_lost_executor_is_rebuilt_up_to_the_limit():
    runner = FakeRunner(*[LOST] * MAX_REBUILDS)
    assert run(runner) == "result" and runner.rebuilds == MAX_REBUILDS
    with pytest.raises(ExecutorsLostError, match=r"iteration 8: the job lost executor-held "
                                                 r"data 4 times.*Command exited with code 137.*"
                                                 r"spark\.executor\.memory\b") as raised:
        run(FakeRunner(*[LOST] * (MAX_REBUILDS + 1)))
    assert "Command exited with code 137" in str(raised.value.__cause__)


STANDALONE_HEAP = LOST.replace("137", "52")


def test_an_executor_whose_heap_ran_out_is_a_memory_kill():
    """A standalone or local-cluster executor whose JVM ran out of heap exits with code 52:
    rebuilt once, then the memory error naming the JVM's heap and the settings that bound what
    it holds (not the Python workers' ones, which a heap does not need)."""
    assert memory_kill_reason(RuntimeError(STANDALONE_HEAP)) is not None
    runner = FakeRunner(STANDALONE_HEAP, STANDALONE_HEAP)
    with pytest.raises(ExecutorMemoryError, match=r"ran out of heap twice.*code 52.*"
                                                  r"spark\.executor\.memory.*"
                                                  r"spark\.sparkdl\.maxRecordBytes") as raised:
        run(runner)
    assert "pyspark.memory" not in str(raised.value)
    assert runner.rebuilds == 1


def test_other_failures_are_not_retried():
    runner = FakeRunner("PythonException: ZeroDivisionError: division by zero")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run(runner)
    assert runner.rebuilds == 0


DRIVER_OOM = ("An error occurred while calling "
              "z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
              ": java.lang.OutOfMemoryError: Java heap space\n"
              "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)\n"
              "\tat org.apache.spark.util.io.ChunkedByteBufferOutputStream.allocateNewChunk")
EXECUTOR_HEAP = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD."
                 "collectAndServe.\n: org.apache.spark.SparkException: Job aborted due to stage "
                 "failure: Task 1 in stage 3.0 failed 4 times, most recent failure: Lost task "
                 "1.3 in stage 3.0 (TID 12) (10.0.0.7 executor 2): java.lang.OutOfMemoryError: "
                 "Java heap space")


def test_a_driver_out_of_memory_is_reported_as_such_and_rebuilds_nothing():
    from sparkdl.engine.fit.recovery import DriverMemoryError

    runner = FakeRunner(DRIVER_OOM)
    with pytest.raises(DriverMemoryError, match=r"iteration 8: the driver's JVM ran out of heap "
                                                r"\(java.lang.OutOfMemoryError: Java heap "
                                                r"space\).*spark\.driver\.memory"):
        run(runner)
    assert runner.rebuilds == 0
    # an executor's heap running out (reported through a task) is still an executor's
    assert memory_kill_reason(RuntimeError(EXECUTOR_HEAP)) is not None
    runner = FakeRunner(EXECUTOR_HEAP)
    assert run(runner) == "result" and runner.rebuilds == 1


CRASH = ("Job aborted due to stage failure: Task 1 in stage 2.0 failed 1 times, most recent "
         "failure: Lost task 1.0 in stage 2.0 (TID 5) (localhost executor driver): "
         "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)")


def test_a_python_worker_killed_ends_the_fit_at_once_naming_its_memory():
    """A task's Python worker that dies without a Python error (the machine's or a container's
    out-of-memory killer) through Spark's retries: the memory error at once, no rebuild."""
    runner = FakeRunner(CRASH, CRASH)
    with pytest.raises(ExecutorMemoryError, match=r"iteration 8: a task's Python worker died.*"
                                                  r"crashed.*spark\.executor\.pyspark\.memory"):
        run(runner)
    assert runner.rebuilds == 0
