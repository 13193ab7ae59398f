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
from .file_systems import FileSystemAccess

__all__ = ["CheckpointStore", "FORMAT_VERSION"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_NAME = re.compile(r"^checkpoint-(\d{10})\.pt$")
_SUMMARY = re.compile(r"^summary-(\d{10})\.pt$")


class CheckpointStore:
    """A directory of checkpoints.

    Args:
        path: the directory (created if missing).
        files: how it is reached (:mod:`sparkdl.storage.file_systems`).
    """

    def __init__(self, path: str, files: FileSystemAccess) -> None:
        self.path = path
        self._files = files

    def _error(self, exc: BaseException) -> str:
        return self._files.error_line(exc)

    def check_writable(self) -> None:
        """Create the directory and write, then delete, a probe file; raise if that fails."""
        probe = f".probe-{uuid.uuid4().hex}"
        try:
            self._files.mkdirs(self.path)
            self._files.write(self.path, probe, b"sparkdl")
            self._files.delete(self.path, probe)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint directory {self.path!r} is not writable: "
                                  f"{self._error(exc)}") from exc

    def iterations(self) -> list[int]:
        """Iterations of the complete checkpoints in the directory, ascending."""
        try:
            names = self._files.names(self.path)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint directory {self.path!r} cannot be listed: "
                                  f"{self._error(exc)}") from exc
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def file_name(self, iteration: int) -> str:
        return f"{self.path.rstrip('/')}/checkpoint-{iteration:010d}.pt"

    def _save(self, final: str, state: dict[str, Any]) -> None:
        """``torch.save`` of ``state`` as ``final`` in the directory, atomically: a temporary
        name first (removed if the write fails), then a rename."""
        buf = io.BytesIO()
        torch.save(state, buf)
        tmp_name = f".{final}-{uuid.uuid4().hex}.tmp"
        try:
            self._files.mkdirs(self.path)
            self._files.write(self.path, tmp_name, buf.getbuffer())
            self._files.replace(self.path, tmp_name, final)
        except Exception as exc:
            try:
                self._files.delete(self.path, tmp_name)
            except Exception:     # noqa: BLE001 - the write's own error is the one to report
                pass
            raise CheckpointError(f"Writing {self.path.rstrip('/')}/{final} failed: "
                                  f"{self._error(exc)}") from exc

    def write(self, iteration: int, state: dict[str, Any], keep_last: int) -> str:
        """Write ``state`` as the checkpoint of ``iteration``; keep only the newest ``keep_last``."""
        self._save(f"checkpoint-{iteration:010d}.pt", state)
        for old in self.iterations()[:-keep_last]:
            self._files.delete(self.path, f"checkpoint-{old:010d}.pt")
        return self.file_name(iteration)

    def write_summary_part(self, iteration: int, part: dict[str, Any]) -> None:
        """Write the summary records since the previous checkpoint, as
        ``summary-<iteration>.pt`` beside the checkpoints (atomically; never pruned: each part
        holds only its own records, so the parts stay small however long the run)."""
        self._save(f"summary-{iteration:010d}.pt", part)

    def read_summary_parts(self, upto: int) -> list[dict[str, Any]]:
        """The summary parts of iterations up to ``upto``, in order."""
        names = sorted(n for n in self._files.names(self.path)
                       if _SUMMARY.match(n) and int(_SUMMARY.match(n).group(1)) <= upto)
        parts = []
        for name in names:
            try:
                parts.append(torch.load(io.BytesIO(self._files.read(self.path, name)),
                                        weights_only=True))
            except Exception as exc:
                raise CheckpointError(f"The summary part {self.path}/{name} is unreadable "
                                      f"({type(exc).__name__}: {str(exc)[:200]})") from exc
        return parts

    def read(self, iteration: int) -> dict[str, Any]:
        """Load one checkpoint (``weights_only=True``); raise a clear error if it is unusable."""
        name = self.file_name(iteration)
        try:
            data = self._files.read(self.path, f"checkpoint-{iteration:010d}.pt")
        except Exception as exc:
            raise CheckpointError(f"Reading checkpoint {name} failed: {self._error(exc)}"
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
