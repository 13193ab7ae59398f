"""Which Spark executor this Python worker works for (executor side).

Spark tells a Python worker its task's partition, stage and attempt, not its executor. Every
cluster manager starts an executor as a JVM whose command line names it
(``CoarseGrainedExecutorBackend`` and its YARN and Kubernetes subclasses: ``--executor-id ID
--hostname HOST``), and the Python worker is that JVM's child (through pyspark's daemon, or
directly). :func:`executor_location` walks up the worker's parent processes under ``/proc`` to that
command line and returns the executor as Spark's scheduler names a place for a task,
``executor_<host>_<id>``: the driver can then ask for a task to run there
(:mod:`sparkdl.runners.shard_placement`). It returns ``""`` where that cannot be known (local
mode, whose tasks run in the driver's JVM; a system without ``/proc``): the driver then leaves
placement to Spark, as without replicas.

Example::

    executor_location()      # "executor_10.0.0.7_3" in an executor's Python worker
"""

from __future__ import annotations

import os

__all__ = ["executor_location"]

_MAX_DEPTH = 8
_location: str | None = None


def _parent_and_command(pid: int) -> tuple[int, list[str]]:
    with open(f"/proc/{pid}/stat", "rb") as f:      # "pid (comm) state ppid ...": comm may hold ")"
        parent = int(f.read().rsplit(b")", 1)[1].split()[1])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
    return parent, command


def _named(command: list[str]) -> str:
    """``executor_<host>_<id>`` from an executor backend's command line, or ""."""
    try:
        executor = command[command.index("--executor-id") + 1]
        host = command[command.index("--hostname") + 1]
    except (ValueError, IndexError):
        return ""
    return f"executor_{host}_{executor}" if executor and host else ""


def executor_location() -> str:
    """``executor_<host>_<id>`` of the executor JVM above this process, or ``""`` when there is
    none to be found (found once per process)."""
    global _location
    if _location is None:
        found, pid = "", os.getpid()
        for _ in range(_MAX_DEPTH):
            try:
                parent, command = _parent_and_command(pid)
            except (OSError, ValueError, IndexError):
                break
            found = _named(command)
            if found or parent <= 1:
                break
            pid = parent
        _location = found
    return _location
