"""Whole files through ``pyarrow.fs``: the file access of Spark Connect runs, where the client
has no JVM (checkpoints, saved stages, the exchange directory of large weights).

A path is resolved by :func:`~sparkdl.storage.local_paths.local_path` (plain paths, ``file:/``,
``file:///`` and ``file://localhost/`` are local, or a mount the cluster shares: NFS, a
FUSE-mounted bucket) and otherwise by ``pyarrow.fs.FileSystem.from_uri``: ``s3://``, ``gs://``, ``abfs://``
and ``hdfs://`` (with libhdfs) reach those stores. The same path must name the same place from the
client and from the executors, as with any path Spark is given.

Example::

    files = ArrowFiles()
    files.write("s3://bucket/run1", "weights.bin", data)
    data = files.read("s3://bucket/run1", "weights.bin")
"""

from __future__ import annotations

import posixpath
from typing import Any

from .local_paths import local_path

__all__ = ["ArrowFiles", "resolve"]


def resolve(path: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) for ``path``: a local path in any of its spellings
    (:func:`~sparkdl.storage.local_paths.local_path`), or a URI of another file system."""
    from pyarrow import fs

    local = local_path(path)
    if local is not None:
        return fs.LocalFileSystem(), local
    return fs.FileSystem.from_uri(path)


class ArrowFiles:
    """:class:`sparkdl.storage.file_systems.FileSystemAccess` through ``pyarrow.fs`` (see the
    module docstring)."""

    def _join(self, directory: str, name: str | None = None) -> tuple[Any, str]:
        fs, base = resolve(directory)
        return fs, base if name is None else posixpath.join(base, name)

    def mkdirs(self, directory: str) -> None:
        fs, path = self._join(directory)
        fs.create_dir(path, recursive=True)

    def names(self, directory: str) -> list[str]:
        from pyarrow import fs as pafs

        fs, path = self._join(directory)
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            return []
        return [posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(path))]

    def write(self, directory: str, name: str, data: bytes | memoryview) -> None:
        fs, path = self._join(directory, name)
        fs.create_dir(posixpath.dirname(path), recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(data)

    def read(self, directory: str, name: str) -> bytes:
        fs, path = self._join(directory, name)
        with fs.open_input_stream(path) as stream:
            return stream.read()

    def replace(self, directory: str, source: str, target: str) -> None:
        fs, src = self._join(directory, source)
        _, dst = self._join(directory, target)
        fs.move(src, dst)

    def delete(self, directory: str, name: str) -> None:
        fs, path = self._join(directory, name)
        try:
            fs.delete_file(path)
        except FileNotFoundError:       # as Hadoop's delete: gone already is fine
            pass

    def delete_tree(self, directory: str) -> None:
        from pyarrow import fs as pafs

        fs, path = self._join(directory)
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)

    def error_line(self, exc: BaseException) -> str:
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
