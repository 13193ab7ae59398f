"""Checkpoints: the whole training state, written atomically through Hadoop's FileSystem.

A checkpoint directory holds ``checkpoint-<iteration>.pt`` files, each a ``torch.save`` of plain
data (tensors, numbers, strings, lists, dicts) that loads with ``torch.load(...,
weights_only=True)``. A file is first written under a hidden temporary name in the same directory
and then renamed, so a reader never sees half a checkpoint. Paths go through Spark's Hadoop
``FileSystem``: ``hdfs://``, ``s3a://``, ``file://`` and plain paths (resolved against
``fs.defaultFS``, i.e. local under ``local[*]`` and HDFS on most YARN clusters) all work.

Example::

    opt.set_checkpoint("hdfs:///user/me/ckpt/run1", EveryEpoch(), keep_last=3)
    opt.optimize()   # resumes from the newest checkpoint in that directory, if there is one
"""

from __future__ import annotations

import io
import logging
import re
import uuid
from typing import Any

import torch

from ..errors import CheckpointError
from .hadoop_files import hadoop_path, java_error_line, read_bytes, write_bytes

__all__ = ["CheckpointStore", "FORMAT_VERSION"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_NAME = re.compile(r"^checkpoint-(\d{10})\.pt$")


class CheckpointStore:
    """A directory of checkpoints on any Hadoop-supported file system.

    Args:
        path: the directory (created if missing).
        sc: the active SparkContext (its Hadoop configuration is used).
    """

    def __init__(self, path: str, sc: Any) -> None:
        self.path = path
        self._sc = sc
        try:
            self._fs, self._dir = hadoop_path(sc, path)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint path {path!r} cannot be used: "
                                  f"{java_error_line(exc)}") from exc

    def _child(self, name: str) -> Any:
        return self._sc._jvm.org.apache.hadoop.fs.Path(self._dir, name)

    def check_writable(self) -> None:
        """Create the directory and write, then delete, a probe file; raise if that fails."""
        probe = f".probe-{uuid.uuid4().hex}"
        try:
            self._fs.mkdirs(self._dir)
            write_bytes(self._sc, self.path, b"sparkdl", probe)
            self._fs.delete(self._child(probe), False)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint directory {self.path!r} is not writable: "
                                  f"{java_error_line(exc)}") from exc

    def iterations(self) -> list[int]:
        """Iterations of the complete checkpoints in the directory, ascending."""
        try:
            if not self._fs.exists(self._dir):
                return []
            statuses = self._fs.listStatus(self._dir)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint directory {self.path!r} cannot be listed: "
                                  f"{java_error_line(exc)}") from exc
        found = []
        for status in statuses:
            m = _NAME.match(status.getPath().getName())
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def file_name(self, iteration: int) -> str:
        return f"{self.path.rstrip('/')}/checkpoint-{iteration:010d}.pt"

    def write(self, iteration: int, state: dict[str, Any], keep_last: int) -> str:
        """Write ``state`` as the checkpoint of ``iteration``; keep only the newest ``keep_last``."""
        buf = io.BytesIO()
        torch.save(state, buf)
        final = self._child(f"checkpoint-{iteration:010d}.pt")
        tmp_name = f".checkpoint-{iteration:010d}-{uuid.uuid4().hex}.tmp"
        tmp = self._child(tmp_name)
        try:
            self._fs.mkdirs(self._dir)
            write_bytes(self._sc, self.path, buf.getvalue(), tmp_name)
            if self._fs.exists(final):
                self._fs.delete(final, False)
            if not self._fs.rename(tmp, final):
                raise OSError(f"rename to {final.toString()} failed")
        except Exception as exc:
            raise CheckpointError(f"Writing checkpoint {self.file_name(iteration)} failed: "
                                  f"{java_error_line(exc)}") from exc
        for old in self.iterations()[:-keep_last]:
            self._fs.delete(self._child(f"checkpoint-{old:010d}.pt"), False)
        return self.file_name(iteration)

    def read(self, iteration: int) -> dict[str, Any]:
        """Load one checkpoint (``weights_only=True``); raise a clear error if it is unusable."""
        name = self.file_name(iteration)
        try:
            data = read_bytes(self._sc, self.path, f"checkpoint-{iteration:010d}.pt")
        except Exception as exc:
            raise CheckpointError(f"Reading checkpoint {name} failed: {java_error_line(exc)}"
                                  ) from exc
        try:
            state = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint file {name} is corrupt or not a sparkdl "
                                  f"checkpoint ({type(exc).__name__}: {str(exc)[:300]}). Delete "
                                  "it to resume from the one before.") from exc
        if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"The checkpoint file {name} is not a sparkdl checkpoint of "
                                  f"format {FORMAT_VERSION}.")
        return state

