"""Reading a known number of bytes from a stream (a socket's file or a file) into a buffer.

The driver reads the tasks' results from the JVM's result socket straight into their places in
a vector (:func:`sparkdl.transport.frames.collect_messages`), and tasks and the driver read
values and sums from files on a local master (:mod:`sparkdl.transport.pieced_broadcast`,
:mod:`sparkdl.transport.allreduce`): each is a fixed number of bytes into a writable buffer,
with an error that says what ended early.

Example::

    block = np.empty(1000, dtype=np.float32)
    with open(path, "rb", buffering=0) as f:
        read_exactly(f, block, f"{path} holds fewer than {block.nbytes} bytes")
"""

from __future__ import annotations

from typing import Any

__all__ = ["read_exactly"]


def read_exactly(stream: Any, target: Any,
                 ended: str = "the driver's result stream ended inside a frame") -> None:
    """Fill ``target`` (a writable buffer) from ``stream`` (a socket's or a file's, with
    ``readinto``), raising ``EOFError(ended)`` if the stream ends first."""
    view, done = memoryview(target).cast("B"), 0
    while done < len(view):
        n = stream.readinto(view[done:])
        if not n:
            raise EOFError(ended)
        done += n
