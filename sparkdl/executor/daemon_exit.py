"""A Python worker that pyspark's daemon forked ends without a traceback when the JVM has
closed its socket (executor side).

With pyspark 4.1+ and Unix-domain sockets between the JVM and its Python workers (sparkdl's
recommended ``spark.python.unix.domain.socket.enabled``), ``SparkContext.stop`` closes the idle
workers' sockets before it ends their daemon. Each idle worker, waiting for its next task,
reads the end of its input, writes its error report, and its last flush meets the closed
socket: the daemon's ``worker`` function raises ``BrokenPipeError``
(``spark.python.daemon.killWorkerOnFlushFailure``, on by default) and the forked worker prints
the traceback before it exits. On a local master that is the user's terminal, after the job's
result: a traceback at the end of every successful job.

:func:`quiet_closed_socket_once`, called by sparkdl's tasks, wraps the daemon's ``worker``
function in the worker process it runs in: a ``BrokenPipeError`` out of it (the JVM's end is
gone, so nothing can be reported to it) ends the worker as a failed flush did, without the
traceback; anything else is raised as before. Outside a worker forked by ``pyspark.daemon``
(the driver, ``spark.python.use.daemon=false``) it does nothing.

Example::

    quiet_closed_socket_once()     # in a task, before its work
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["quiet_closed_socket_once"]

_WRAPPED = "__sparkdl_quiet_closed_socket__"


def quiet_closed_socket_once() -> None:
    """In a worker forked by ``pyspark.daemon``, wrap its ``worker`` function (once) so that a
    ``BrokenPipeError`` ends the worker quietly (see the module docstring)."""
    daemon = sys.modules.get("__main__")
    spec = getattr(daemon, "__spec__", None)
    if getattr(spec, "name", None) != "pyspark.daemon":
        return
    worker = getattr(daemon, "worker", None)
    if not callable(worker) or getattr(worker, _WRAPPED, False):
        return
    setattr(daemon, "worker", _quiet(worker))


def _quiet(worker: Callable[..., int]) -> Callable[..., int]:
    def quiet_worker(*args: Any, **kwargs: Any) -> int:
        try:
            return worker(*args, **kwargs)
        except BrokenPipeError:
            return 1        # the daemon's child then stops serving and exits, as it would
    setattr(quiet_worker, _WRAPPED, True)
    return quiet_worker
