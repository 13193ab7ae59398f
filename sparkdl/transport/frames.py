"""Byte frames through PySpark jobs without pickling them.

PySpark normally pickles what a Python task yields, the JVM carries the pickles, and the next
Python side unpickles them: for a 38 MiB gradient block that is two extra copies and a pass of
the pickler at every hop. The AllReduce instead moves *frames*: ``bytes`` or any contiguous
buffer (a ``memoryview`` of a numpy array travels with no copy in Python), written length-prefixed
by PySpark's ``NoOpSerializer`` and handed over as ``bytes`` on the other side.

This relies on the same RDD internals that ``RDD.partitionBy`` itself uses (``_bypass_serializer``,
``PairwiseRDD``, ``PythonPartitioner``, ``PythonRDD.valueOfPair``), present from Spark 1 to 4.

Example::

    def emit(partition, records):
        for frame in message_frames(partition, block):     # a header, then the block's frames
            yield from keyed_frame(k, frame)                # ... all sent to partition k
    shuffled = shuffle_frames(rdd.mapPartitionsWithIndex(emit), num_partitions)
    frames = raw_output(shuffled.mapPartitionsWithIndex(reduce)).collect()   # list of bytes
    for head, payload in read_messages(frames): ...
    # or each payload read from the result socket straight into its place in a vector:
    messages = collect_messages(raw_output(shuffled.mapPartitionsWithIndex(reduce)),
                                lambda head: vector[lo(head):hi(head)])
"""

from __future__ import annotations

import itertools
import pickle
from typing import Any, Callable, Iterable, Iterator

from pyspark import RDD
from pyspark.serializers import NoOpSerializer, SpecialLengths, pack_long, read_int

from .python_jobs import JobRdd
from .stream_reads import read_exactly

__all__ = ["MAX_FRAME_BYTES", "raw_output", "shuffle_frames", "keyed_frame",
           "buffer_frames", "header", "read_header", "join_frames", "message_frames", "read_messages",
           "collect_messages"]

MAX_FRAME_BYTES = 1 << 30
"""Largest frame written (PySpark refuses frames of 2 GiB or more); longer buffers are split."""

_PARTITIONER_ID = 0x5DC0DE


def raw_output(rdd: RDD) -> RDD:
    """Mark a not yet computed ``mapPartitions`` RDD as yielding frames: what its function yields
    (bytes-like objects) is written as is, and ``collect()`` returns them as ``bytes``."""
    rdd._bypass_serializer = True  # type: ignore[attr-defined]
    return rdd


def keyed_frame(key: int, frame: Any) -> Iterator[Any]:
    """The two items a :func:`shuffle_frames` input yields to send ``frame`` to partition
    ``key``."""
    yield pack_long(key)
    yield frame


def shuffle_frames(keyed: Any, num_partitions: int) -> Any:
    """Shuffle the frames that ``keyed`` yields through :func:`keyed_frame`: frame of key ``k``
    ends in partition ``k``, in the order each map task yielded them (a reducer reads one map
    task's frames after another, never interleaved). The result's functions receive ``bytes``.
    ``keyed``: a pyspark ``RDD`` (gives an ``RDD``) or a
    :class:`sparkdl.transport.python_jobs.JobRdd` (gives a ``JobRdd``)."""
    if isinstance(keyed, JobRdd):
        return keyed.jobs.partition_frames(keyed, num_partitions, _PARTITIONER_ID)
    raw_output(keyed)
    sc = keyed.ctx
    jvm = sc._jvm
    pairs = jvm.PairwiseRDD(keyed._jrdd.rdd()).asJavaPairRDD()
    partitioner = jvm.PythonPartitioner(int(num_partitions), _PARTITIONER_ID)
    return RDD(jvm.PythonRDD.valueOfPair(pairs.partitionBy(partitioner)), sc, NoOpSerializer())


def header(obj: Any) -> bytes:
    """A small pickled frame (what a payload is, who sent it)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def read_header(frame: bytes) -> Any:
    return pickle.loads(frame)


def buffer_frames(buffer: Any, frame_bytes: int = MAX_FRAME_BYTES) -> list[memoryview]:
    """``buffer`` (bytes or a contiguous numpy array) as frames of at most ``frame_bytes``
    (never above :data:`MAX_FRAME_BYTES`), without copying: each frame is one record, and one
    allocation, in the JVM that reads it."""
    view = memoryview(buffer).cast("B")
    step = max(1, min(int(frame_bytes), MAX_FRAME_BYTES))
    if len(view) <= step:
        return [view]
    return [view[lo:lo + step] for lo in range(0, len(view), step)]


def join_frames(frames: list[bytes]) -> bytes:
    """The buffer that :func:`buffer_frames` cut (no copy for a single frame)."""
    return frames[0] if len(frames) == 1 else b"".join(frames)


def message_frames(head: Any, payload: Any, frame_bytes: int = MAX_FRAME_BYTES
                   ) -> Iterator[Any]:
    """A message: a header frame holding ``head`` and the payload's frame count, then the
    payload's frames of at most ``frame_bytes`` each (none when ``payload`` is None)."""
    frames = [] if payload is None else buffer_frames(payload, frame_bytes)
    yield header((head, len(frames)))
    yield from frames


def read_messages(frames: Iterable[bytes]) -> Iterator[tuple[Any, bytes | None]]:
    """The ``(head, payload)`` pairs that :func:`message_frames` wrote, in order."""
    stream = iter(frames)
    for frame in stream:
        head, count = read_header(frame)
        payload = None
        if count:
            parts = list(itertools.islice(stream, count))
            if len(parts) < count:
                raise EOFError(f"a stream of frames ended inside a message of {head!r}: "
                               f"{len(parts)} of its {count} payload frames came")
            payload = join_frames(parts)
        yield head, payload


def _read_bytes(stream: Any, length: int) -> bytes:
    if length < 0:
        raise EOFError(f"unexpected frame length {length} in the driver's result stream")
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the driver's result stream ended inside a frame")
    return data


def collect_messages(rdd: Any, destination: Callable[[Any], Any],
                     call_site: str | None = None,
                     partitions: list[int] | None = None,
                     expected: int | None = None) -> list[tuple[Any, Any]]:
    """Collect the messages (:func:`message_frames`) that a :func:`raw_output` RDD, or a
    :class:`sparkdl.transport.python_jobs.JobRdd` (its job named ``call_site``), yields to the
    driver, reading each payload straight from the JVM's result socket into the writable buffer
    ``destination(head)`` returns for it (one copy fewer than ``collect()``, which makes a
    ``bytes`` object of every frame), or into a new ``bytes`` object where it returns None.

    Returns ``(head, payload)`` per message in arrival order (partition order for ``collect``),
    the payload being the destination buffer, the bytes, or None. Uses the same driver-side
    internals as ``RDD.collect`` (``PythonRDD.collectAndServe`` and
    ``local_connect_and_auth``, alike from pyspark 3.4 to 4.3; :mod:`sparkdl.spark_compat`).
    ``partitions`` (a ``JobRdd``'s only): a job of only those partitions (``PythonRDD.runJob``,
    as ``SparkContext.runJob``).

    The JVM ends the stream by closing it, so an end between two messages looks like the
    last one: ``expected``, the number of messages the job yields (one per reduce task, one
    per partition), makes any other count an ``EOFError`` (a stream cut short); a stream that
    ends inside a message is one always."""
    from pyspark.traceback_utils import SCCallSiteSync
    from ..spark_compat import local_connect_and_auth

    if isinstance(rdd, JobRdd):
        sock_info = rdd.jobs.serve(rdd, call_site or "sparkdl job", partitions)
    else:
        with SCCallSiteSync(rdd.ctx):     # the job named by the user's call site, as collect()
            sock_info = rdd.ctx._jvm.PythonRDD.collectAndServe(rdd._jrdd.rdd())
    stream, sock = local_connect_and_auth(sock_info[0], sock_info[1])
    sock.settimeout(None)       # as collect(): the results may take any time to come
    messages: list[tuple[Any, Any]] = []
    try:
        while True:
            try:
                length = read_int(stream)
            except EOFError:            # the JVM closes the stream after the last element
                length = SpecialLengths.END_OF_DATA_SECTION
            if length == SpecialLengths.END_OF_DATA_SECTION:
                if expected is not None and len(messages) != expected:
                    raise EOFError(
                        f"the driver's result stream ended after {len(messages)} messages, "
                        f"but its job yields {expected}: the results were cut short (the "
                        "connection to the driver's JVM was lost, or a task yielded less "
                        "than it should)")
                return messages
            head, count = read_header(_read_bytes(stream, length))
            if not count:
                messages.append((head, None))
                continue
            target = destination(head)
            view = None if target is None else memoryview(target).cast("B")
            offset, frames = 0, []
            for frame in range(count):
                try:
                    length = read_int(stream)
                except EOFError:
                    raise EOFError(f"the driver's result stream ended inside a message of "
                                   f"{head!r}: {frame} of its {count} payload frames came"
                                   ) from None
                if view is None:
                    frames.append(_read_bytes(stream, length))
                    continue
                if length < 0 or offset + length > len(view):
                    raise ValueError(f"a message of {head!r} is longer than its destination "
                                     f"({len(view)} bytes)")
                read_exactly(stream, view[offset:offset + length])
                offset += length
            if view is not None and offset != len(view):
                raise ValueError(f"a message of {head!r} filled {offset} of its destination's "
                                 f"{len(view)} bytes")
            messages.append((head, target if view is not None else join_frames(frames)))
    finally:
        stream.close()
        sock.close()
