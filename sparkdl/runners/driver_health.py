"""Whether a failed job failed because the driver ran out of memory, and a watch for the one
driver failure Spark itself never reports: a result-fetching thread dying (driver side).

A job's results pass through the driver's JVM. When it runs out of heap:

* in the thread that called it (collecting results, making a broadcast), the py4j call raises
  ``java.lang.OutOfMemoryError``;
* on a ``local`` master the tasks run in the driver's JVM too: Spark's handler then exits the
  JVM (exit code 52), every later call fails, and the job's error says the SparkContext was
  shut down;
* in a ``task-result-getter`` thread, which deserialises the tasks' results, or another thread
  of the driver's that Spark never expects to die, the thread dies and the job never ends: the
  watch (:mod:`.driver_watch`) ends it;
* in the transport's thread that receives a result for a ``task-result-getter`` thread (on a
  cluster, from an executor's block manager): the fetch fails, the result counts as lost
  (``TaskResultLost``) and the task is run again; the job ends once a task has failed
  ``spark.task.maxFailures`` times, or once the results sent again pass
  ``spark.driver.maxResultSize`` (which counts every attempt's), its error never naming the
  memory. sparkdl calls it the driver's memory when the heap filled up during the fit (full
  collections, or its largest pool's peak: :data:`HEAP_FULL_SHARE`); a result lost otherwise
  (an executor's block manager out of the driver's reach) keeps the job's own error.

:class:`DriverHealth` tells these apart from an executor's memory (which a rebuild of the
shards may help) for :func:`sparkdl.engine.fit.recovery.run_with_recovery`, and keeps the watch
over the driver's JVM (:class:`~.driver_watch.DriverWatch`) while the fit's jobs run.

Example::

    health = DriverHealth(sc)
    health.watch()                       # while the fit's jobs run
    try:
        run_the_job()
    except Exception as exc:
        reason = health.failure(exc)     # "the driver's JVM ran out of heap ...", or None
    health.stop()
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import exception_text
from ..spark_settings import (DRIVER_JOB_BYTES, driver_job_bytes_setting, is_local_master,
                              spark_setting, storage_pool_bytes)
from ..transport.allreduce import driver_job_bytes
from .cached_rdd import driver_memory_reason
from .driver_watch import DriverWatch, driver_process

__all__ = ["DriverHealth", "driver_heap_failure", "driver_job_share", "HEAP_FULL_SHARE",
           "SPARK_OOM_EXIT_CODE"]

log = logging.getLogger(__name__)

HEAP_FULL_SHARE = 0.75
"""A lost result is the driver's memory when the JVM collected its whole heap during the fit
(it does before every ``OutOfMemoryError``), or when the heap's largest pool (the old
generation) peaked at this share of its limit or more."""

SPARK_OOM_EXIT_CODE = 52
"""The exit code of a Spark JVM whose handler saw an ``OutOfMemoryError``."""

_LOST_RESULT = "TaskResultLost"
_FULL_COLLECTORS = ("Old Generation", "MarkSweep")
_RESULTS_ABOVE_LIMIT = "is bigger than spark.driver.maxResultSize"
_SHUT_DOWN = ("SparkContext was shut down", "SparkContext has been shutdown",
              "Cannot call methods on a stopped SparkContext")
_ADVICE = ("Give the driver more memory: spark.driver.memory (its JVM heap holds the tasks' "
           "results and the weights' broadcast pieces while they pass through)")


def max_result_bytes(sc: Any) -> int:
    """``spark.driver.maxResultSize`` of ``sc``'s running configuration, in bytes (0: none)."""
    return int(sc._jsc.sc().conf().getSizeAsBytes("spark.driver.maxResultSize", "1g"))


def driver_job_share(sc: Any, pieces_bytes: int = 0) -> int:
    """The most bytes of task results one job may hand this driver
    (:func:`~sparkdl.transport.allreduce.driver_job_bytes` of its JVM's heap, of
    ``spark.driver.maxResultSize`` and of ``spark.sparkdl.driverJobBytes``), while its block
    store holds ``pieces_bytes`` of broadcast pieces it seeds (at most its storage pool:
    :func:`~sparkdl.spark_settings.storage_pool_bytes`).

    Example: ``driver_job_share(sc, 2 * weights_bytes)`` for a fit broadcasting its weights
    every iteration (this iteration's pieces and the last's)."""
    heap = int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory())
    results = max_result_bytes(sc)
    held = 0
    if pieces_bytes > 0:
        fraction = float(spark_setting(sc, "spark.memory.fraction") or 0.6)
        held = min(int(pieces_bytes), storage_pool_bytes(heap, fraction))
    return driver_job_bytes(heap, results,
                            driver_job_bytes_setting(spark_setting(sc, DRIVER_JOB_BYTES)), held)


def driver_heap_failure(exc: BaseException | str, local: bool = False) -> str | None:
    """Why ``exc`` (a job's error, or its text) says the driver's JVM ran out of heap (in the
    call itself; or, on a ``local`` master, in a task, which runs in that JVM), naming the
    setting to raise; else None."""
    text = exc if isinstance(exc, str) else exception_text(exc)
    own = driver_memory_reason(text)
    if own is not None:
        return f"the driver's JVM ran out of heap ({own}). {_ADVICE}."
    if local and "java.lang.OutOfMemoryError" in text:
        return ("a task ran the driver's JVM out of heap (on a local master the tasks run in "
                f"the driver's JVM). {_ADVICE}.")
    return None


class DriverHealth:
    """The driver-side memory failures of one SparkContext (see the module docstring)."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc
        self.local = is_local_master(str(sc.master))
        self._watch = DriverWatch(sc)
        self._full_at_watch: int | None = None

    # ------------------------------------------------------------------------- classification
    def jvm_exit(self, wait: float = 0.0) -> int | None:
        """The exit code of the driver's JVM when it was started by this Python process and has
        exited (waiting up to ``wait`` seconds for it), else None."""
        proc = driver_process(self.sc)
        if proc is None:
            return None
        try:
            return proc.wait(timeout=wait) if wait else proc.poll()
        except Exception:        # still running
            return None

    def failure(self, exc: BaseException) -> str | None:
        """Why ``exc`` (a job's error) is the driver's memory, in words naming the setting to
        raise, or None when it is not the driver's."""
        if self._watch.dead is not None:
            return f"the driver's {self._watch.dead}. {_ADVICE}."
        try:
            text, gone = str(exc), False
        except Exception:        # noqa: BLE001 - a Java exception's text went with its JVM
            text, gone = "", True
        stopping = gone or (any(marker in text for marker in _SHUT_DOWN) and self._stopped())
        code = self.jvm_exit(wait=10.0 if stopping else 0.0)   # a JVM exiting: its code
        if code is not None:
            why = (" after an OutOfMemoryError (Spark's exit code 52)"
                   if code == SPARK_OOM_EXIT_CODE else "")
            return f"the driver's JVM exited with code {code}{why}. {_ADVICE}."
        # the text read once: a Java exception's is fetched from a JVM that may be ending
        reason = driver_heap_failure(text, self.local) or self._lost_results(text)
        if reason is not None:
            return reason
        if stopping:
            return ("the SparkContext stopped during the fit (the driver's log says why; the "
                    "driver's JVM running out of heap is the usual cause). " + _ADVICE + ".")
        return None

    def _lost_results(self, text: str) -> str | None:
        """Why a job whose tasks' results the driver failed to fetch failed, when its heap
        filled up meanwhile (see the module docstring), or None. A result lost without the
        heap filling (an executor's block manager the driver could not reach) is not the
        driver's memory: the job's own error stands."""
        lines = [line.strip(" :") for line in text.splitlines()]
        lost = next((line for line in lines if _LOST_RESULT in line), None)
        above = next((line for line in lines if _RESULTS_ABOVE_LIMIT in line), None)
        if lost is None and above is None:
            return None
        try:
            share = driver_job_share(self.sc)
            limit = max_result_bytes(self.sc)
            chosen = spark_setting(self.sc, DRIVER_JOB_BYTES)
        except Exception:       # noqa: BLE001 - the context is gone: the general advice stands
            share, limit, chosen = 0, 0, ""
        if lost is None and share and limit and share > limit:
            return (f"{above[:300]}: spark.sparkdl.driverJobBytes ({share / 2**20:.0f} MiB) "
                    "lets one job hand the driver more than spark.driver.maxResultSize "
                    f"({limit / 2**20:.0f} MiB). Lower the one or raise the other (and "
                    "spark.driver.memory with it).")
        peak, full = self._heap_peak(), self._full_collections()
        fulls = full - self._full_at_watch if full is not None and self._full_at_watch is not None \
            else 0
        if fulls <= 0 and (peak is None or peak[0] < HEAP_FULL_SHARE * peak[1]):
            return None
        seen = [f"{fulls} full collections of its heap"] if fulls > 0 else []
        if peak is not None:
            seen.append(f"its largest pool peaking at {peak[0] / 2**20:.0f} of "
                        f"{peak[1] / 2**20:.0f} MiB")
        filled = (f"fetching them filled the driver's heap ({', '.join(seen)} during the fit; "
                  "the driver's log has the java.lang.OutOfMemoryError)")
        advice = _ADVICE + (f", or lower spark.sparkdl.driverJobBytes ({chosen}; by default a "
                            "job hands the driver at most an eighth of its heap)" if chosen else "")
        if lost is not None:
            return (f"the driver's result-fetching threads lost the tasks' results: "
                    f"{lost[:300]}: {filled}. {advice}.")
        jobs = (f" (this fit's jobs hand the driver at most {share / 2**20:.0f} MiB each, so "
                "only results fetched again reach it)" if share else "")
        return (f"the driver's result-fetching threads lost the tasks' results and the results "
                f"sent again passed the limit: {above[:300]}{jobs}: {filled}. {advice}.")

    def _heap_peak(self) -> tuple[int, int] | None:
        """The most bytes the driver's largest heap pool (the old generation) held since the
        watch last started, and its limit; None when the JVM cannot say."""
        try:
            pool = self._heap_pool()
            if pool is None:
                return None
            usage = pool.getPeakUsage()
            return int(usage.getUsed()), int(usage.getMax())
        except Exception:       # noqa: BLE001 - the JVM is gone: no evidence
            return None

    def _full_collections(self) -> int | None:
        """How many collections of the whole heap (G1's "Old Generation", Parallel's and
        Serial's mark-sweep) the driver's JVM has made: one happens before every
        ``OutOfMemoryError`` and, with sparkdl's small use of the heap, hardly otherwise."""
        try:
            beans = self.sc._jvm.java.lang.management.ManagementFactory \
                .getGarbageCollectorMXBeans()
            return sum(int(b.getCollectionCount()) for b in beans
                       if any(word in str(b.getName()) for word in _FULL_COLLECTORS))
        except Exception:       # noqa: BLE001 - the JVM is gone: no evidence
            return None

    def _heap_pool(self) -> Any:
        pools = self.sc._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
        heap = [(int(p.getUsage().getMax()), p) for p in pools
                if str(p.getType().toString()) == "Heap memory"]
        largest = max(heap, key=lambda pair: pair[0], default=(0, None))
        return largest[1] if largest[0] > 0 else None

    def _stopped(self) -> bool:
        try:
            return bool(self.sc._jsc.sc().isStopped())
        except Exception:        # the JVM is gone
            return True

    # ------------------------------------------------------------------------- the watch
    def watch(self) -> None:
        """Start the watch over the driver's JVM (again after :meth:`stop`; a running one is
        kept), and the record of its heap's use, the evidence for lost results."""
        if self._watch.running:
            return
        try:
            pool = self._heap_pool()
            if pool is not None:
                pool.resetPeakUsage()
        except Exception:        # noqa: BLE001 - no evidence then, nothing else changes
            pass
        self._full_at_watch = self._full_collections()
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
