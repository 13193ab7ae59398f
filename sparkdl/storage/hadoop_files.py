"""Whole files read and written through Spark's Hadoop FileSystem (any URI Spark supports), in
chunks of a few MiB per py4j call, never as one string.

Example::

    write_bytes(sc, "hdfs:///models/m1/weights.pt", data)
    data = read_bytes(sc, "hdfs:///models/m1/weights.pt")
"""

from __future__ import annotations

import re
import io
from typing import Any

__all__ = ["hadoop_path", "write_bytes", "read_bytes", "java_error_line", "HadoopFiles",
           "CHUNK_BYTES"]


def hadoop_path(sc: Any, path: str, child: str | None = None) -> tuple[Any, Any]:
    """(FileSystem, Path) for ``path`` (joined with ``child``). The FileSystem is Hadoop's
    cached instance, which the whole JVM shares: never change its settings."""
    jvm = sc._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    if child is not None:
        hpath = jvm.org.apache.hadoop.fs.Path(hpath, child)
    return hpath.getFileSystem(sc._jsc.hadoopConfiguration()), hpath


CHUNK_BYTES = 4 << 20
"""Bytes per py4j call when a file is written or read through the JVM: a whole large file in one
call travels as one string several times its size and kills a default 1 GiB driver's gateway."""


def write_bytes(sc: Any, path: str, data: bytes | memoryview, child: str | None = None) -> None:
    """Write ``data`` as one file, in chunks of :data:`CHUNK_BYTES`, through a private FileSystem
    instance that writes no .crc side file (the shared cached instance is left as it is)."""
    _, hpath = hadoop_path(sc, path, child)
    fs = sc._jvm.org.apache.hadoop.fs.FileSystem.newInstance(hpath.toUri(),
                                                             sc._jsc.hadoopConfiguration())
    view = memoryview(data).cast("B")
    try:
        fs.setWriteChecksum(False)
        out = fs.create(hpath, True)
        try:
            for start in range(0, len(view), CHUNK_BYTES):
                out.write(bytearray(view[start:start + CHUNK_BYTES]))
        finally:
            out.close()
    finally:
        fs.close()


def read_bytes(sc: Any, path: str, child: str | None = None) -> bytes:
    """A whole file, read in chunks of :data:`CHUNK_BYTES` into one buffer of the file's size,
    which becomes the returned ``bytes`` without a copy: the driver holds a large checkpoint
    once, plus one chunk."""
    fs, hpath = hadoop_path(sc, path, child)
    size = int(fs.getFileStatus(hpath).getLen())
    data = io.BytesIO()
    if size:            # size the buffer once: the writes below never grow it
        data.seek(size - 1)
        data.write(b"\0")
        data.seek(0)
    stream = fs.open(hpath)
    try:
        io_utils = sc._jvm.org.apache.commons.io.IOUtils
        for start in range(0, size, CHUNK_BYTES):
            data.write(io_utils.toByteArray(stream, min(CHUNK_BYTES, size - start)))
    finally:
        stream.close()
    if data.tell() != size:
        raise OSError(f"{hpath.toString()} ended after {data.tell()} of its {size} bytes")
    # BytesIO hands over its own buffer when nothing else holds a view of it: no copy
    return data.getvalue()


def java_error_line(exc: BaseException) -> str:
    """The informative line of a Py4J error: the Java exception's message, without py4j's
    leading ``": "`` and the exception's class name (``Mkdirs failed to create /x``), or the
    first line."""
    text = str(exc)
    for line in text.splitlines():
        if "Exception:" in line:
            message = line.strip().lstrip(":").strip()
            return _JAVA_CLASS.sub("", message, count=1) or message
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


_JAVA_CLASS = re.compile(r"^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): *")
"""A Java exception's qualified class name at the start of its line."""


class HadoopFiles:
    """:class:`sparkdl.storage.file_systems.FileSystemAccess` through the JVM's Hadoop
    FileSystem of a classic SparkContext ``sc`` (any URI the cluster supports)."""

    def __init__(self, sc: Any) -> None:
        self._sc = sc

    def _path(self, directory: str, name: str | None = None) -> tuple[Any, Any]:
        return hadoop_path(self._sc, directory, name)

    def mkdirs(self, directory: str) -> None:
        fs, path = self._path(directory)
        fs.mkdirs(path)

    def names(self, directory: str) -> list[str]:
        fs, path = self._path(directory)
        if not fs.exists(path):
            return []
        return [s.getPath().getName() for s in fs.listStatus(path)]

    def write(self, directory: str, name: str, data: bytes | memoryview) -> None:
        write_bytes(self._sc, directory, data, name)

    def read(self, directory: str, name: str) -> bytes:
        return read_bytes(self._sc, directory, name)

    def replace(self, directory: str, source: str, target: str) -> None:
        fs, src = self._path(directory, source)
        _, dst = self._path(directory, target)
        if fs.exists(dst):
            fs.delete(dst, False)
        if not fs.rename(src, dst):
            raise OSError(f"rename to {dst.toString()} failed")

    def delete(self, directory: str, name: str) -> None:
        fs, path = self._path(directory, name)
        fs.delete(path, False)

    def delete_tree(self, directory: str) -> None:
        fs, path = self._path(directory)
        if fs.exists(path):
            fs.delete(path, True)

    def error_line(self, exc: BaseException) -> str:
        return java_error_line(exc)
