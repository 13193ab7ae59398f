"""Large values broadcast in pieces, so that no single object in the driver's JVM grows with them.

A pyspark broadcast reaches the executors through the driver's JVM: Spark's torrent broadcast
reads the whole pickled value into the JVM heap to cut it into its 4 MiB blocks, and an executor
assembles the whole value in its heap again before handing it to the Python workers. A model's
weights (and a local round's optimizer states, a model bundle) can be larger than either heap.
:func:`pieced_broadcast` sends a value above :data:`PIECE_BYTES` as many broadcasts of at most
that many bytes each: a JVM then holds one piece at a time while it cuts or assembles it, and
the pieces it keeps are ordinary storage blocks (``MEMORY_AND_DISK``: spilled to disk when the
heap is wanted). The task reads :attr:`PiecedValue.value`: the pieces are copied into buffers of
the value's size and unpickled from them (numpy arrays are pickled out of band, so they are
rebuilt on those buffers without another copy), and each piece's own copy in the Python worker
is dropped as soon as it is read.

On a ``local[...]`` master the tasks run on the driver's machine, and a broadcast's pieces are
kept in the driver's heap (its block manager stores them for remote executors there are none of)
although the tasks read the value's file: there a large value is a :class:`FileValue` instead, a
file under the context's temporary directory that the tasks read, and nothing of it enters the
JVM (not under ``spark.io.encryption.enabled``, which keeps it encrypted through pyspark's own
broadcast).

Example::

    handle = pieced_broadcast(sc.broadcast, {"weights": big_array})   # 3 GB: 96 broadcasts
    task reads handle.value["weights"]                               # the same array
    handle.destroy(blocking=False)                                    # every piece
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
from typing import Any, Callable

import numpy as np

from ..spark_settings import DEFAULT_RECORD_BYTES
from .stream_reads import read_exactly

__all__ = ["PIECE_BYTES", "PiecedValue", "FileValue", "pieced_broadcast"]

log = logging.getLogger(__name__)

PIECE_BYTES = DEFAULT_RECORD_BYTES
"""The largest broadcast :func:`pieced_broadcast` makes by default (and the largest block a
large vector's AllReduce hands the driver: :mod:`sparkdl.transport.allreduce`); the setting
``spark.sparkdl.maxRecordBytes`` chooses another (:mod:`sparkdl.spark_settings`)."""


class _SegmentedValue:
    """A value as its pickle stream and out-of-band buffers (``segments``: their byte lengths;
    a ``raw`` value: one segment, the value's own bytes; ``raw == "array"``: a flat ``uint8``
    array's, read back as one), read once per task into buffers of
    those lengths by :meth:`_fill` and unpickled from them."""

    def __init__(self, segments: list[int], raw: bool | str) -> None:
        self.segments, self.raw = segments, raw
        self._value: Any = None
        self._read = False

    @property
    def nbytes(self) -> int:
        return sum(self.segments)

    @property
    def value(self) -> Any:
        value = self._value
        if not self._read or value is None:    # (a local: a forget() cannot make it None)
            buffers = [bytearray(n) for n in self.segments]
            self._fill(buffers)
            if self.raw == "array":
                value = np.frombuffer(buffers[0], dtype=np.uint8)   # writable: ours
            elif self.raw:
                value = buffers[0]
            else:
                value = pickle.loads(buffers[0], buffers=buffers[1:])
            self._value, self._read = value, True
        return value

    def _fill(self, buffers: list[bytearray]) -> None:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop the value this task read (it is read again if asked for): a task that has
        copied it where it belongs need not hold it while it computes. Not while another thread
        of the task may be reading it."""
        self._value, self._read = None, False


class PiecedValue(_SegmentedValue):
    """A value sent as pieces (see the module docstring): ``.value`` in a task, ``destroy()`` on
    the driver, as a pyspark ``Broadcast``; ``places``: for each piece, its segment and offset
    there."""

    def __init__(self, pieces: list[Any], segments: list[int], places: list[tuple[int, int]],
                 raw: bool | str) -> None:
        super().__init__(segments, raw)
        self.pieces, self.places = pieces, places

    def _fill(self, buffers: list[bytearray]) -> None:
        for (segment, offset), piece in zip(self.places, self.pieces):
            data = memoryview(piece.value).cast("B")
            memoryview(buffers[segment])[offset:offset + len(data)] = data
            _forget(piece)

    def destroy(self, blocking: bool = False) -> None:
        for piece in self.pieces:
            piece.destroy(blocking=blocking)

    def unpersist(self, blocking: bool = False) -> None:
        for piece in self.pieces:
            piece.unpersist(blocking=blocking)

    def __getstate__(self) -> dict[str, Any]:       # a task gets the pieces, never the value
        return {"pieces": self.pieces, "segments": self.segments, "places": self.places,
                "raw": self.raw}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["pieces"], state["segments"], state["places"], state["raw"])


class FileValue(_SegmentedValue):
    """A value written to one file on the driver's machine, for tasks that run there (a local
    master): ``.value`` reads it back as :class:`PiecedValue` does; ``destroy()`` removes the
    file (driver side)."""

    def __init__(self, path: str, segments: list[int], raw: bool | str) -> None:
        super().__init__(segments, raw)
        self.path = path

    def _fill(self, buffers: list[bytearray]) -> None:
        with open(self.path, "rb", buffering=0) as f:
            for buffer in buffers:
                read_exactly(f, buffer, f"{self.path} ended early: it holds a value of "
                                        f"{self.nbytes} bytes")

    def mapped(self) -> np.ndarray:
        """A raw value's bytes mapped from its file, copy-on-write (writable, private): its
        pages are the page cache's, shared by every task on the machine that maps the file, and
        read only as they are used; no buffer of the value's size is made."""
        if not self.raw:
            raise TypeError(f"{self.path} holds a pickled value, not raw bytes")
        return np.memmap(self.path, dtype=np.uint8, mode="c", shape=(self.segments[0],))

    def destroy(self, blocking: bool = False) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def unpersist(self, blocking: bool = False) -> None:
        pass

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "segments": self.segments, "raw": self.raw}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["segments"], state["raw"])


def _forget(piece: Any) -> None:
    """Drop a read piece's value from this Python worker (pyspark keeps a broadcast's value for
    the worker's life; it is read again from its file if ever asked for)."""
    if getattr(piece, "_path", None) is not None and "_value" in piece.__dict__:
        del piece.__dict__["_value"]


def pieced_broadcast(broadcast: Callable[[Any], Any], value: Any,
                     piece_bytes: int = PIECE_BYTES, local_dir: str | None = None) -> Any:
    """``broadcast(value)`` when ``value`` pickles to at most ``piece_bytes``, else a
    :class:`PiecedValue` of broadcasts of at most ``piece_bytes`` each, or with ``local_dir``
    (the tasks run on this machine) a :class:`FileValue` there. ``bytes``-like values and flat
    ``uint8`` arrays (a state vector) travel as their own bytes and read back as a
    ``bytearray`` of them, or an array for an array (or :meth:`FileValue.mapped`)."""
    raw: bool | str = isinstance(value, (bytes, bytearray, memoryview))
    if (isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1 and
            value.flags.c_contiguous):
        raw = "array"
    if raw:
        segments = [memoryview(value).cast("B")]
    else:
        buffers: list[pickle.PickleBuffer] = []
        stream = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        segments = [memoryview(stream)] + [b.raw() for b in buffers]
    total = sum(len(s) for s in segments)
    if total <= piece_bytes:
        return broadcast(value)
    if local_dir is not None:
        with tempfile.NamedTemporaryFile(dir=local_dir, prefix="sparkdl-value-",
                                         delete=False) as out:
            for segment in segments:
                out.write(segment)
        return FileValue(out.name, [len(seg) for seg in segments], raw)
    pieces, places = [], []
    for k, segment in enumerate(segments):
        for offset in range(0, len(segment), piece_bytes):
            pieces.append(broadcast(bytes(segment[offset:offset + piece_bytes])))
            places.append((k, offset))
    log.debug("a %.1f MiB value broadcast in %d pieces", total / 2**20, len(pieces))
    return PiecedValue(pieces, [len(s) for s in segments], places, raw)
