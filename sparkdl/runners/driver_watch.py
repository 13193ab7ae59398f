"""The watch over the driver's JVM while a fit's jobs run: the failures that Spark itself never
reports, each of which would leave the fit waiting forever.

An ``OutOfMemoryError`` is fatal to the driver thread it hits, and the driver's JVM has no
handler that exits on it, so the thread just dies with what it held:

* a result-fetching thread (``task-result-getter-N``): its task's result never arrives;
* a message-loop thread (``dispatcher-event-loop-N``): the message it delivered (on a local
  master, a task's status) is lost, and the pool starts another thread;
* the scheduler backend's own message loop on a cluster (``dispatcher-CoarseGrainedScheduler``,
  one thread, replaced under the same name): the task status it delivered is lost, and with it
  a finished task's result when it came in the message (``spark.task.maxDirectResultSize``);
  the job waits for a task that has ended;
* the DAG scheduler's thread (``dag-scheduler-event-loop``): no job can end, nor be cancelled.

For the first three the watch cancels the running jobs; for the scheduler's it stops the
SparkContext, which fails them. Spark's handler exits the JVM when a task runs out of heap (on
a local master the tasks run in the driver's JVM): when a shutdown hook blocks, the JVM never
ends and the calls waiting on it never return. A JVM still exiting :data:`EXIT_GRACE_SECONDS`
after it began is killed (it was going away; only the driver's own JVM: the one this Python
process started, or its parent under ``spark-submit``), and the calls fail.

The watch looks every :data:`WATCH_SECONDS`, at the threads it knows and at whether the JVM is
exiting; every fifth look it finds the threads started since (a thread of a pool that started
and died between two looks leaves a gap in the pool's numbers). Threads gone before the watch
started are not this fit's: they are ignored.

Example::

    watch = DriverWatch(sc)
    watch.start()                  # while the fit's jobs run
    ...                            # a job's error: watch.dead says what the watch saw, or None
    watch.stop()
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from ..errors import exception_text

__all__ = ["DriverWatch", "driver_process", "WATCH_SECONDS", "EXIT_GRACE_SECONDS", "POOLS",
           "LOOPS", "SCHEDULER"]

log = logging.getLogger(__name__)

WATCH_SECONDS = 2.0
"""How often the watch looks at the driver's threads and at whether its JVM is exiting."""

EXIT_GRACE_SECONDS = 25.0
"""How long a driver JVM may take to exit (its shutdown hooks stop the SparkContext, whose jobs
then fail) before the watch kills it."""

POOLS = ("task-result-getter", "dispatcher-event-loop")
"""The driver's fixed pools of threads whose death loses what they held (their threads are
numbered from 0 as they start)."""

LOOPS = ("dispatcher-CoarseGrainedScheduler",)
"""The driver's endpoints with a message loop of their own, one thread each, whose death loses
the message it delivered (a task's status); a new thread of the same name replaces it."""

SCHEDULER = "dag-scheduler-event-loop"
"""The DAG scheduler's one thread: without it no job ends."""

_FIND_EVERY = 5


def driver_process(sc: Any) -> Any:
    """The driver's JVM as the process this Python process started (``subprocess.Popen``), or
    None (under ``spark-submit`` the JVM started this process)."""
    return getattr(getattr(sc, "_gateway", None), "proc", None)


class DriverWatch:
    """The driver-side failures that leave a fit waiting forever (see the module docstring)."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc
        self.dead: str | None = None
        """What the watch saw and did, in words; None while nothing happened."""
        self._threads: dict[int, tuple[str, Any]] = {}    # by the JVM's thread id: names repeat
        self._scheduler: Any = None
        self._known_gaps: set[str] = set()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._probe: Any = None
        self._pid: int | None = None
        self._owned = False
        self._exiting_since: float | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return (self._watcher is not None and self._watcher.is_alive()
                and not self._stop.is_set())

    def start(self) -> None:
        """Start watching (again after :meth:`stop`; a running watch is kept). A JVM that cannot
        be looked at (the calls fail) is not watched."""
        if self.running:
            return
        self._stop = threading.Event()
        self._exiting_since, self.dead = None, None
        self._threads, self._scheduler, self._known_gaps = {}, None, set()
        self._probe, self._pid, self._owned = None, None, False
        try:
            jvm = self.sc._jvm
            pid = int(jvm.java.lang.ProcessHandle.current().pid())
            proc = driver_process(self.sc)
            self._known_gaps = set(self._find())       # gone before this fit: not its own
            if self._scheduler_missing():
                self._known_gaps.add(SCHEDULER)
            self._probe = jvm.java.lang.Thread()        # a hook never added: see _exiting
        except Exception as exc:      # noqa: BLE001 - a JVM that cannot be watched: fit unwatched
            log.warning("the driver's JVM cannot be watched during the fit: %s",
                        exception_text(exc)[:300])
            return
        self._pid = pid
        self._owned = (proc is not None and proc.pid == pid) or os.getppid() == pid
        self._watcher = threading.Thread(target=self._run, args=(self._stop,),
                                         name="sparkdl-driver-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop watching. A JVM of the driver's own that began to exit is seen out first: its
        end awaited, or it is killed once it has been exiting for :data:`EXIT_GRACE_SECONDS`,
        so that no fit leaves a driver JVM stuck exiting behind it (holding its ports, its
        memory and its parent's pipes)."""
        self._stop.set()
        while self._owned and self._exiting() and not self._exit_stuck():
            time.sleep(WATCH_SECONDS)
        # ended before this returns: a daemon thread still logging (py4j logs every call into
        # a JVM that is gone) when the interpreter exits holds the logging handler's lock for
        # good, and the interpreter's last collection (py4j's connections log as they close)
        # then waits for it forever
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=2 * WATCH_SECONDS + 10)

    # ------------------------------------------------------------------------- the looks
    def _run(self, stop: threading.Event) -> None:
        looked = failed = 0
        while not stop.wait(WATCH_SECONDS):
            if self._ended():
                return
            if self._exiting():
                if self._exit_stuck():
                    return
                continue
            try:
                gone = self._gone(looked)
                looked, failed = looked + 1, 0
            except Exception:          # noqa: BLE001 - the JVM is gone, or going: next look
                failed += 1
                if failed == 3:
                    return
                continue
            if gone and not stop.is_set():     # a stopped watch's late look acts on nothing
                self._act(sorted(set(gone), key=lambda name: name != SCHEDULER)[0])
                return

    def _gone(self, looked: int) -> list[str]:
        """The watched threads that died since the watch started (none once the SparkContext
        stopped: its threads end with it)."""
        gone = [name for name, thread in self._threads.values() if not thread.isAlive()]
        if looked % _FIND_EVERY == _FIND_EVERY - 1:  # new threads (py4j calls per thread)
            gone += [name for name in self._find() if name not in self._known_gaps]
        if self._scheduler_missing() and SCHEDULER not in self._known_gaps:
            gone.append(SCHEDULER)
        if gone and self.sc._jsc.sc().isStopped():
            return []
        return gone

    def _act(self, name: str) -> None:
        if name == SCHEDULER:
            self.dead = (f"DAG scheduler's thread {SCHEDULER} died (almost always of a "
                         "java.lang.OutOfMemoryError: the driver's log has it), so no job could "
                         "end any more: the watch stopped the SparkContext")
            log.error("the driver's %s", self.dead)
            try:
                self.sc._jsc.sc().stop()
            except Exception:          # noqa: BLE001 - stopped already
                pass
            return
        kind = ("result-fetching" if name.startswith(POOLS[0]) else
                "scheduler backend's message-loop" if name in LOOPS else "message-loop")
        self.dead = (f"{kind} thread {name} died (almost always of a "
                     "java.lang.OutOfMemoryError: the driver's log has it), losing what it held "
                     "(a task's result or status), so its jobs were cancelled")
        log.error("the driver's %s; cancelling the running jobs, which would wait for it "
                  "forever", self.dead)
        try:
            self.sc.cancelAllJobs()
        except Exception:              # noqa: BLE001 - the context stopped: its jobs ended
            pass

    def _find(self) -> list[str]:
        """Track the watched pools' and loops' threads alive now, and the scheduler's; the names
        of any pool's that were started and died unseen (a pool numbers its threads from 0 as
        they start; on ``local-cluster`` the master's and workers' pools share the names)."""
        for thread in self.sc._jvm.java.lang.Thread.getAllStackTraces().keySet().toArray():
            name = str(thread.getName())
            if name == SCHEDULER:
                self._scheduler = self._scheduler or thread
            elif name.rsplit("-", 1)[0] in POOLS or name in LOOPS:
                self._threads.setdefault(int(thread.getId()), (name, thread))
        gaps = []
        for pool in POOLS:
            numbers = {int(n.rsplit("-", 1)[1]) for n, _ in self._threads.values()
                       if n.rsplit("-", 1)[0] == pool and n.rsplit("-", 1)[1].isdigit()}
            gaps += [f"{pool}-{k}" for k in range(max(numbers, default=-1)) if k not in numbers]
        return gaps

    def _scheduler_missing(self) -> bool:
        """The SparkContext runs, but its DAG scheduler's thread is not (or no longer) alive."""
        if self._scheduler is not None and self._scheduler.isAlive():
            return False
        return not self.sc._jsc.sc().isStopped()

    # ------------------------------------------------------------------------- a JVM exiting
    def _ended(self) -> bool:
        """The driver's JVM, started by this process, has ended (no call could reach it)."""
        proc = driver_process(self.sc)
        try:
            return proc is not None and proc.poll() is not None
        except Exception:             # noqa: BLE001 - not a process this one can ask
            return False

    def _exiting(self) -> bool:
        """Whether the driver's JVM is running its shutdown hooks (it refuses a new one then)."""
        if self._probe is None or self._ended():
            return False
        try:
            runtime = self.sc._jvm.java.lang.Runtime.getRuntime()
            runtime.addShutdownHook(self._probe)
            runtime.removeShutdownHook(self._probe)
            return False
        except Exception as exc:      # noqa: BLE001 - "Shutdown in progress", or the JVM is gone
            return "Shutdown in progress" in exception_text(exc)

    def _exit_stuck(self) -> bool:
        """Note when the JVM began to exit; kill it once it has been exiting for
        :data:`EXIT_GRACE_SECONDS`. True when the watch is done."""
        with self._lock:
            return self._exit_stuck_locked()

    def _exit_stuck_locked(self) -> bool:
        if self.dead is not None and self.dead.startswith("JVM began to exit"):
            return True                # killed already (by the watch, or by stop())
        now = time.monotonic()
        if self._exiting_since is None:
            self._exiting_since = now
            log.warning("the driver's JVM is exiting (Spark exits it after an "
                        "OutOfMemoryError in a task); waiting up to %.0f s for it to end",
                        EXIT_GRACE_SECONDS)
        if now - self._exiting_since < EXIT_GRACE_SECONDS:
            return False
        stuck = (f"JVM began to exit (Spark exits it after an OutOfMemoryError in one of its "
                 f"threads) and was still exiting {EXIT_GRACE_SECONDS:.0f} s later, one of its "
                 "shutdown hooks blocked: ")
        if not self._owned:
            self.dead = stuck + "it is not this process's to end, and the fit waits for it"
            log.error("the driver's %s", self.dead)
            return True
        # said (whole, at once) before the kill: the calls it ends read it at once
        self.dead = stuck + "the watch killed it, so that the calls waiting on it fail"
        log.error("the driver's %s", self.dead)
        proc = driver_process(self.sc)
        try:
            if proc is not None and proc.pid == self._pid:
                proc.kill()
            else:                      # under spark-submit: this process's parent
                os.kill(self._pid, signal.SIGKILL)
        except OSError as exc:
            log.debug("the driver's JVM ended meanwhile: %s", exc)
        return True
