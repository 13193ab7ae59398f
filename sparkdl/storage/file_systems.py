"""What checkpoints and saved stages need of a file system, and which implementation a session
gets: the JVM's Hadoop FileSystem on a classic session (:class:`HadoopFiles`), ``pyarrow.fs``
under Spark Connect, where the client has no JVM (:class:`ArrowFiles`).

Example::

    files = files_for_session(df.sparkSession)
    files.write("/models/m1", "weights.pt", data)
"""

from __future__ import annotations

from typing import Any, Protocol

from .arrow_files import ArrowFiles
from .hadoop_files import HadoopFiles

__all__ = ["FileSystemAccess", "files_for_session", "is_connect_session",
           "is_connect_object"]


class FileSystemAccess(Protocol):
    """Whole-file operations on a directory (a path or URI) and a name in it."""

    def mkdirs(self, directory: str) -> None: ...
    def names(self, directory: str) -> list[str]:
        """The entries' names; empty when the directory does not exist."""
    def write(self, directory: str, name: str, data: bytes | memoryview) -> None: ...
    def read(self, directory: str, name: str) -> bytes: ...
    def replace(self, directory: str, source: str, target: str) -> None:
        """Rename ``source`` to ``target``, replacing it if it exists."""
    def delete(self, directory: str, name: str) -> None: ...
    def delete_tree(self, directory: str) -> None:
        """Delete the directory and everything in it (nothing if it does not exist)."""
    def error_line(self, exc: BaseException) -> str:
        """The informative line of an error these operations raised."""


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no py4j).

    Every sparkdl entry point asks this before any work, so a Connect session on a pyspark
    whose Connect client sparkdl cannot use (older than 4.1) raises
    :class:`~sparkdl.errors.InvalidArgumentError` here, naming the version it needs
    (:func:`sparkdl.spark_compat.check_connect_supported`)."""
    if not is_connect_object(spark):
        return False
    from ..spark_compat import check_connect_supported

    check_connect_supported()
    return True


def is_connect_object(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session, on any pyspark (never raises)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except Exception:              # the connect extra is not installed: not a Connect session
        return False
    return isinstance(spark, ConnectSession)


def files_for_session(spark: Any) -> FileSystemAccess:
    """The file access of ``spark``'s driver side (see the module docstring)."""
    if is_connect_session(spark):
        return ArrowFiles()
    return HadoopFiles(spark.sparkContext)
