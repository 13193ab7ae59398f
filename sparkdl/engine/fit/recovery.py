"""Running a job so that lost executor-held data costs time, never the run (driver side).

A job can fail because data the runner keeps on the executors was lost with an executor (the
runner recognises such failures), or it can finish with partitions whose shard was not where
their task ran. Either way the data is rebuilt from its source and the job runs again; since
every job is deterministic, the result is the one an undisturbed job would have given.

Example::

    result = run_with_recovery(runner, train, lambda: runner.gradients(train, step, w),
                               lambda r: r.missing_partitions, "iteration 7")
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

from ...errors import SparkdlError
from ...spark_settings import MAX_RECORD_BYTES
from ...runners.cached_rdd import worker_crash_reason
from ...runners.executor_imports import executor_import_error, missing_sparkdl_reason
from ...runners.interface import DataHandle, IterationRunner

__all__ = ["MAX_REBUILDS", "run_with_recovery", "ExecutorMemoryError", "ExecutorsLostError",
           "DriverMemoryError"]

log = logging.getLogger("sparkdl")

MAX_REBUILDS = 3
"""Rebuilds of one data set allowed for one job before the run fails."""

T = TypeVar("T")


class ExecutorMemoryError(SparkdlError, MemoryError):
    """An executor was killed for exceeding its memory, again after a rebuild; or a task's
    Python worker was killed (for memory) through Spark's retries."""


class ExecutorsLostError(SparkdlError):
    """Jobs kept losing executor-held data, through every rebuild allowed."""


class DriverMemoryError(SparkdlError, MemoryError):
    """The driver's JVM ran out of heap: rebuilding the executors' shards cannot help."""


def _memory_message(what: str, line: str) -> str:
    if "code 52" in line:       # Spark's exit code for an OutOfMemoryError: the JVM's heap
        return (f"{what}: an executor's JVM ran out of heap twice ({line}); a rebuild does not "
                "help. Give the executors' JVMs more heap (spark.executor.memory), or lower "
                f"{MAX_RECORD_BYTES} (default 32m: the largest gradient block, task result and "
                "broadcast piece a JVM holds; a heap holds several of each at once, and its "
                "block store fills with the weights' broadcast pieces), or use fewer tasks per "
                "executor (spark.executor.cores).")
    return (f"{what}: an executor was killed for exceeding its memory limit twice ({line}); a "
            "rebuild does not help. Give the executors more memory: "
            "spark.executor.memoryOverhead (YARN and Kubernetes count the Python workers, the "
            "model, its gradient and the shards' page cache there), spark.executor.pyspark.memory "
            "(the Python workers' own limit) or spark.executor.memory (the JVM heap, which holds "
            "the gradient blocks of the shuffle); or use smaller micro-batches "
            "(micro_batch_size / microBatchSize), fewer tasks per executor, or more partitions.")


def _crash_message(what: str, line: str) -> str:
    return (f"{what}: a task's Python worker died without an error of its own, after Spark's "
            f"retries ({line}). A Python worker dies this way almost always because it was "
            "killed for memory: by the operating system when the machine runs out (on a local "
            "master the driver, every task's model with its gradient and Spark share one "
            "machine), or by the cluster manager's limit on the executor's container (a crash "
            "in native code ends the same way: the executor's stderr then shows it, and no "
            "setting helps). For memory, give the Python workers more "
            "memory (spark.executor.pyspark.memory, spark.executor.memoryOverhead; a larger "
            "machine for a local master), or use fewer tasks per executor or smaller "
            "micro-batches (micro_batch_size / microBatchSize). Nothing was rebuilt: the "
            "executors' data is not at fault.")


def run_with_recovery(runner: IterationRunner, data: DataHandle, job: Callable[[], T],
                      missing: Callable[[T], list[int]], what: str) -> T:
    """``job()``, rebuilt and re-run while it lost ``data`` (at most :data:`MAX_REBUILDS`
    times); ``missing(result)`` lists the partitions that found no data where they ran."""
    memory_kills = 0
    for attempt in range(MAX_REBUILDS + 1):
        try:
            result = job()
        except Exception as exc:
            driver = runner.driver_failure(exc)
            if driver is not None:
                raise DriverMemoryError(f"{what}: {driver} Nothing was rebuilt: the executors' "
                                        "data is not at fault.") from exc
            reason = runner.lost_data_reason(exc)
            crash = worker_crash_reason(exc)
            if crash is not None and reason is None:
                raise ExecutorMemoryError(_crash_message(what, crash)) from exc
            memory = runner.memory_kill_reason(exc)
            if memory is not None:
                memory_kills += 1
                if memory_kills > 1:
                    raise ExecutorMemoryError(_memory_message(what, memory)) from exc
                log.warning("%s: an executor was killed for exceeding its memory (%s); "
                            "rebuilding once, in case the limit was hit by chance", what, memory)
            if reason is None and memory is None:
                missing = missing_sparkdl_reason(exc)    # an executor that joined without it
                if missing is not None:
                    raise executor_import_error(what, missing) from exc
                raise
            if attempt == MAX_REBUILDS:
                raise ExecutorsLostError(
                    f"{what}: the job lost executor-held data {MAX_REBUILDS + 1} times in a row, "
                    f"through {MAX_REBUILDS} rebuilds (the last time: {reason or memory}). "
                    "Executors that keep being lost are often out of memory without saying so: "
                    "look for OutOfMemoryError or exit code 52 (the executor's JVM heap: "
                    "spark.executor.memory) or 137 (killed by the machine or the cluster "
                    "manager: spark.executor.memoryOverhead, spark.executor.pyspark.memory) in "
                    "the executors' logs.") from exc
            runner.rebuild(data, f"the job of {what} lost executor-held data "
                                 f"({reason or memory})")
            continue
        lost = missing(result)
        if not lost:
            return result
        runner.rebuild(data, f"partitions {lost} found no shard on the executor that ran them")
    raise SparkdlError(f"{what}: the {data.name} shards could not be kept on the executors "
                       f"after {MAX_REBUILDS} rebuilds")
