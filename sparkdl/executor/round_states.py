"""Each partition's inner state in local rounds (its optimizer's and scheduler's state dicts),
kept beside the partition's shard and copied where checkpoints go (executor side).

A round's task reads its partition's state at the round's first iteration and writes the state
at the next round's first iteration; the driver never holds them (design notes, section 9).
Two places hold them, both as ``torch.save`` files of tensors and plain values that load with
``torch.load(..., weights_only=True)`` (nothing in them unpickles code, and no size limit
below the file system's):

* **beside the shard**: ``<shard root>/<data key>/round-states/<fit key>/part-<p>/it-<t>.pt``
  on the executor that ran the task (the shard store's directory, removed with the shards).
  A state is written under a temporary name, then renamed; the task of the round starting at
  ``t`` drops its partition's states before ``t``: the driver starts that round only after the
  previous one committed, so a retried or speculative attempt of a round always finds the
  state it started from.
* **durable** (:class:`DurableStates`): every K-th round's starting states, written by the
  tasks themselves to ``<directory>/it-<t>/part-<p>.pt`` (a local or shared path, or any URI
  ``pyarrow.fs`` reaches: ``hdfs://``, ``s3://``). A partition whose state is not beside its
  shard (a lost executor, a placement miss, a resumed driver) is rebuilt from the last durable
  copy by replaying the rounds since with their global weights (the driver keeps them).

Example::

    here = StateDir(data_key, fit_key, partition)
    save_state(here.path(t), {"optimizer": opt.state_dict(), "scheduler": None})
    state = load_state(here.path(t))           # None when it is not here
    here.drop_before(t)
"""

from __future__ import annotations

import io
import os
import re
import uuid
from typing import Any

import torch

from ..storage.local_paths import local_path
from .shard_store import shard_root

__all__ = ["StateDir", "DurableStates", "save_state", "load_state", "state_bytes"]

_NAME = re.compile(r"^it-(\d{10})\.pt$")


def _file_name(iteration: int) -> str:
    return f"it-{iteration:010d}.pt"


def save_state(path: str, state: dict[str, Any]) -> None:
    """``state`` into ``path`` atomically (a temporary name in the same directory, then a
    rename): a reader sees the whole file or none."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as out:
            torch.save(state, out)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_state(path: str) -> dict[str, Any] | None:
    """The state in ``path`` (``weights_only=True``), or None when there is none."""
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        return None


def state_bytes(state: dict[str, Any]) -> bytes:
    """``state`` as the bytes of a ``torch.save`` file."""
    out = io.BytesIO()
    torch.save(state, out)
    return out.getvalue()


class StateDir:
    """Where this executor keeps one partition's states of one fit (beside its shard)."""

    def __init__(self, data_key: str, fit_key: str, partition: int,
                 root: str | None = None) -> None:
        self.directory = os.path.join(root or shard_root(), data_key or "in-process",
                                      "round-states", fit_key, f"part-{partition:05d}")

    def path(self, iteration: int) -> str:
        """The file of the state at the start of ``iteration``."""
        return os.path.join(self.directory, _file_name(iteration))

    def drop_before(self, iteration: int) -> None:
        """Remove the states of iterations before ``iteration`` (their rounds committed)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            match = _NAME.match(name)
            if match is not None and int(match.group(1)) < iteration:
                try:
                    os.remove(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass


class DurableStates:
    """The durable copies of a fit's states under ``root`` (a local path or a URI that
    ``pyarrow.fs`` opens), one directory per round start: ``it-<t>/part-<p>.pt``."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _where(self, iteration: int, partition: int) -> tuple[str, str]:
        directory = f"{self.root.rstrip('/')}/{_file_name(iteration)[:-3]}"
        return directory, f"part-{partition:05d}.pt"

    def has(self, iteration: int, partition: int) -> bool:
        """Whether the copy of ``partition``'s state at ``iteration`` is there."""
        directory, name = self._where(iteration, partition)
        local = local_path(directory)
        if local is not None:
            return os.path.exists(os.path.join(local, name))
        fs, base = _remote(directory)
        import pyarrow.fs as pafs
        return fs.get_file_info(f"{base}/{name}").type != pafs.FileType.NotFound

    def save(self, iteration: int, partition: int, state: dict[str, Any]) -> None:
        """Write the copy (atomically: a temporary name, then a rename)."""
        directory, name = self._where(iteration, partition)
        local = local_path(directory)
        if local is not None:
            save_state(os.path.join(local, name), state)
            return
        fs, base = _remote(directory)
        fs.create_dir(base, recursive=True)
        tmp = f"{base}/.tmp-{uuid.uuid4().hex}"
        with fs.open_output_stream(tmp) as out:
            torch.save(state, out)
        fs.move(tmp, f"{base}/{name}")

    def load(self, iteration: int, partition: int) -> dict[str, Any] | None:
        """The copy (``weights_only=True``), or None when it is not there."""
        directory, name = self._where(iteration, partition)
        local = local_path(directory)
        if local is not None:
            return load_state(os.path.join(local, name))
        fs, base = _remote(directory)
        try:
            with fs.open_input_file(f"{base}/{name}") as stream:
                return torch.load(io.BytesIO(stream.read()), weights_only=True)
        except FileNotFoundError:
            return None

    def drop_before(self, iteration: int) -> None:
        """Remove the copies of round starts before ``iteration`` (local roots only: a
        remote root keeps them for its storage's own retention)."""
        local = local_path(self.root)
        if local is None or not os.path.isdir(local):
            return
        import shutil
        for name in os.listdir(local):
            match = re.match(r"^it-(\d{10})$", name)
            if match is not None and int(match.group(1)) < iteration:
                shutil.rmtree(os.path.join(local, name), ignore_errors=True)


def _remote(directory: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs
    return pafs.FileSystem.from_uri(directory)
