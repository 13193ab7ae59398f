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

import hashlib
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
_SUMMARY = re.compile(r"^summary-(\d{10})-([0-9a-f]{16})\.pt$")
_LEGACY_SUMMARY = re.compile(r"^summary-(\d{10})\.pt$")


class CheckpointStore:
    """A directory of checkpoints.

    Args:
        path: the directory (created if missing).
        files: how it is reached (:mod:`sparkdl.storage.file_systems`).
    """

    def __init__(self, path: str, files: FileSystemAccess) -> None:
        self.path = path
        self.files = files
        """How the directory is reached."""

    def _error(self, exc: BaseException) -> str:
        return self.files.error_line(exc)

    def check_writable(self) -> None:
        """Create the directory and write, then delete, a probe file; raise if that fails."""
        probe = f".probe-{uuid.uuid4().hex}"
        try:
            self.files.mkdirs(self.path)
            self.files.write(self.path, probe, b"sparkdl")
            self.files.delete(self.path, probe)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint directory {self.path!r} is not writable: "
                                  f"{self._error(exc)}") from exc

    def iterations(self) -> list[int]:
        """Iterations of the complete checkpoints in the directory, ascending."""
        return sorted(int(m.group(1)) for m in map(_NAME.match, self._names()) if m)

    def file_name(self, iteration: int) -> str:
        return f"{self.path.rstrip('/')}/checkpoint-{iteration:010d}.pt"

    def _save(self, final: str, state: dict[str, Any]) -> None:
        """``torch.save`` of ``state`` as ``final`` in the directory, atomically."""
        buf = io.BytesIO()
        torch.save(state, buf)
        self._save_bytes(final, buf.getbuffer())

    def _save_bytes(self, final: str, data: bytes | memoryview) -> None:
        """``data`` as ``final`` in the directory, atomically: a temporary name first (removed if
        the write fails), then a rename."""
        tmp_name = f".{final}-{uuid.uuid4().hex}.tmp"
        try:
            self.files.mkdirs(self.path)
            self.files.write(self.path, tmp_name, data)
            self.files.replace(self.path, tmp_name, final)
        except Exception as exc:
            try:
                self.files.delete(self.path, tmp_name)
            except Exception:     # noqa: BLE001 - the write's own error is the one to report
                pass
            raise CheckpointError(f"Writing {self.path.rstrip('/')}/{final} failed: "
                                  f"{self._error(exc)}") from exc

    def write(self, iteration: int, state: dict[str, Any], keep_last: int) -> str:
        """Write ``state`` as the checkpoint of ``iteration``; keep only the newest ``keep_last``.
        A committed checkpoint is never written again: that is an error."""
        if iteration in self.iterations():
            raise CheckpointError(f"{self.file_name(iteration)} is already committed; a "
                                  "checkpoint is never rewritten.")
        self._save(f"checkpoint-{iteration:010d}.pt", state)
        for old in self.iterations()[:-keep_last]:
            self.files.delete(self.path, f"checkpoint-{old:010d}.pt")
        return self.file_name(iteration)

    def write_summary_part(self, iteration: int, part: dict[str, Any]) -> str:
        """Write the summary records since the previous checkpoint beside the checkpoints, named
        by its iteration and its content hash: ``summary-<iteration>-<sha256[:16]>.pt``
        (atomically). A part with that name is never written again (it holds those bytes);
        returns the name, which the checkpoint that needs it lists."""
        buf = io.BytesIO()
        torch.save(part, buf)
        data = buf.getvalue()
        name = f"summary-{iteration:010d}-{hashlib.sha256(data).hexdigest()[:16]}.pt"
        if name not in self._names():
            self._save_bytes(name, data)
        return name

    def _names(self) -> list[str]:
        try:
            return self.files.names(self.path)
        except Exception as exc:
            raise CheckpointError(f"The checkpoint directory {self.path!r} cannot be listed: "
                                  f"{self._error(exc)}") from exc

    def read_summary_parts(self, names: list[str]) -> list[dict[str, Any]]:
        """The summary parts ``names`` (as a checkpoint lists them), each checked against the
        content hash in its name."""
        parts = []
        for name in names:
            match = _SUMMARY.match(name)
            try:
                data = self.files.read(self.path, name)
            except Exception as exc:
                raise CheckpointError(f"The summary part {self.path}/{name}, which a checkpoint "
                                      f"needs, cannot be read: {self._error(exc)}") from exc
            if match is None or hashlib.sha256(data).hexdigest()[:16] != match.group(2):
                raise CheckpointError(f"The summary part {self.path}/{name} does not hold what "
                                      "its checkpoint recorded (its content hash differs).")
            parts.append(self._load_part(name, data))
        return parts

    def read_legacy_summary_parts(self, upto: int) -> list[dict[str, Any]]:
        """The parts ``summary-<iteration>.pt`` of iterations up to ``upto``, in order, as
        checkpoints written before the parts were named by their content listed them."""
        names = sorted(n for n in self._names()
                       if _LEGACY_SUMMARY.match(n) and
                       int(_LEGACY_SUMMARY.match(n).group(1)) <= upto)
        return [self._load_part(name, self.files.read(self.path, name)) for name in names]

    def _load_part(self, name: str, data: bytes) -> dict[str, Any]:
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"The summary part {self.path}/{name} is unreadable "
                                  f"({type(exc).__name__}: {str(exc)[:200]})") from exc

    def remove_strays(self, keep_parts: list[str]) -> None:
        """Remove what no committed checkpoint needs: summary parts not in ``keep_parts`` (the
        newest checkpoint's, which holds every older one's) and temporary files a stopped
        writer left. Each removal is logged. Parts of the previous format
        (``summary-<iteration>.pt``) stay: an older checkpoint still kept may need them."""
        keep = set(keep_parts)
        for name in self._names():
            stray = (_SUMMARY.match(name) and name not in keep) \
                or (name.startswith(".") and name.endswith(".tmp"))
            if stray:
                log.info("removing %s/%s: no committed checkpoint needs it", self.path, name)
                self.files.delete(self.path, name)

    def read(self, iteration: int) -> dict[str, Any]:
        """Load one checkpoint (``weights_only=True``); raise a clear error if it is unusable."""
        name = self.file_name(iteration)
        try:
            data = self.files.read(self.path, f"checkpoint-{iteration:010d}.pt")
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
