"""How the DataFrame runner ships bytes from the driver to its tasks: inside the task's
function while small, through a file in the exchange directory when large (Spark Connect has
no broadcast; a UDF's closure travels in the query plan, over gRPC, and is copied several
times in the server's heap).

Measured with ``python bench/connect_closure.py`` (bench/RESULTS.md; a local[2] Connect server
with the default 1 GiB heap, 4 tasks per job): a job cost 0.63 s with 1 MiB in its closure,
1.19 s with 4 MiB and 1.95 s with 16 MiB, against 0.88, 0.78 and 0.51 s with the bytes in a file;
a 32 MiB closure ran the server out of heap and killed it. A gradient job's closure holds the
weights and the pickled model, about twice the weights. Hence two limits: with ``exchangeDir``
set, anything above :data:`FILE_ABOVE_BYTES` travels as a file (past the crossover); without
it, models up to :data:`CLOSURE_MAX_BYTES` of weights still ride in the closure (about 16 MiB,
the largest size that stayed safe), and above that ``exchangeDir`` is required: a directory
that the client writes and every executor reads under the same name
(:mod:`sparkdl.storage.arrow_files`).

Example::

    exchange = Exchange("/mnt/shared/sparkdl", run_key)        # driver
    payload = exchange.ship(weights.tobytes(), "weights-7")      # inline or a file
    data = payload.read()                                        # in a task
    exchange.close()                                             # deletes the run's files

Files are never trusted: a payload carries the SHA-256 of its bytes and its file name holds it, a
task refuses a file whose content does not hash to it (:class:`~sparkdl.errors.ExchangeError`),
and the driver never reuses a same-named file it did not verify. On local and mounted paths (a
plain path, ``file:/``, ``file:///`` or ``file://localhost/``:
:func:`~sparkdl.storage.local_paths.local_path`) the run's directory is ``0700`` and its files
``0600``; on object stores and HDFS the store's own access control applies.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass

from ..errors import ExchangeError, InvalidArgumentError
from ..storage.arrow_files import ArrowFiles
from ..storage.local_paths import local_path
from .worker_cache import WorkerCache

__all__ = ["CLOSURE_MAX_BYTES", "FILE_ABOVE_BYTES", "Payload", "Exchange", "check_exchange",
           "drop_payloads"]

log = logging.getLogger(__name__)

CLOSURE_MAX_BYTES = 8 << 20
"""Largest model state (parameters and buffers) shipped inside the tasks' functions when no
``exchangeDir`` is set; above it one is required (see the module docstring)."""

FILE_ABOVE_BYTES = 2 << 20
"""With an exchange directory, payloads above this size travel as files (the measured
crossover is between 1 and 4 MiB of closure, which holds about two payloads)."""

_READ: WorkerCache[bytes] = WorkerCache(capacity=2, freeze=False)
"""Payloads this Python worker read from the exchange directory, by key (executor side): the
current weights and the one before (or the model), never more for large models."""


def drop_payloads() -> None:
    """Forget every payload this worker read (end of a run)."""
    for key in list(_READ.keys()):
        _READ.pop(key)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Payload:
    """Bytes for the tasks: ``inline``, or the file ``name`` in ``directory`` whose content
    hashes (SHA-256) to ``digest``."""

    key: str
    inline: bytes | None = None
    directory: str | None = None
    name: str | None = None
    digest: str = ""

    def read(self) -> bytes:
        """The bytes (a file is read once per Python worker and verified against ``digest``)."""
        if self.inline is not None:
            return self.inline
        assert self.directory is not None and self.name is not None
        return _READ.get_or_create(self.key, self._read_verified)

    def _read_verified(self) -> bytes:
        assert self.directory is not None and self.name is not None
        data = ArrowFiles().read(self.directory, self.name)
        found = _digest(data)
        if found != self.digest:
            raise ExchangeError(
                f"The exchange file {self.directory}/{self.name} does not hold what the driver "
                f"wrote: its SHA-256 is {found[:16]}..., expected {self.digest[:16]}... Another "
                "writer changed or planted it; refusing to load it. Make exchangeDir a "
                "directory only this application's user can write.")
        return data


def check_exchange(state_bytes: int, directory: str | None, owner: str = "exchangeDir") -> None:
    """Raise before any cluster work when a model of ``state_bytes`` needs an exchange
    directory and none was given."""
    if state_bytes > CLOSURE_MAX_BYTES and not directory:
        raise InvalidArgumentError(
            f"The model's weights take {state_bytes / 2**20:.1f} MiB, more than the "
            f"{CLOSURE_MAX_BYTES >> 20} MiB that Spark Connect jobs can carry in their functions: "
            f"set {owner} to a directory that this client writes and every executor reads under "
            "the same name (a shared mount, s3://, gs://, abfs://, hdfs://), through which the "
            "weights then travel.")


class Exchange:
    """The driver side: ships bytes inline up to ``limit`` (default :data:`FILE_ABOVE_BYTES`),
    through files under ``directory/<run key>`` above it (always inline without a directory)."""

    def __init__(self, directory: str | None, run_key: str, limit: int = FILE_ABOVE_BYTES
                 ) -> None:
        # a local directory in whichever spelling, as the absolute path it names here (the
        # executors must not resolve a relative one against their own working directories)
        local = local_path(directory) if directory else None
        if local is not None:
            directory = local
        self.directory = (f"{directory.rstrip('/')}/{run_key}" if directory else None)
        self.run_key = run_key
        self.local = local is not None     # on this machine's file system: kept private
        self.limit = limit
        self._files = ArrowFiles()
        self._written: list[str] = []

    def by_file(self, size: int) -> bool:
        return self.directory is not None and size > self.limit

    def _write(self, file_name: str, data: bytes) -> None:
        """Write privately: a fresh temporary name, then a rename (``0600`` in a ``0700``
        directory on local paths)."""
        assert self.directory is not None
        if self.local:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)
        tmp = f".{file_name}.{uuid.uuid4().hex[:8]}.tmp"
        self._files.write(self.directory, tmp, data)
        if self.local:
            os.chmod(os.path.join(self.directory, tmp), 0o600)
        self._files.replace(self.directory, tmp, file_name)

    def _holds(self, file_name: str, digest: str) -> bool:
        """Whether ``file_name`` exists and holds exactly the bytes hashing to ``digest``."""
        assert self.directory is not None
        if file_name not in self._files.names(self.directory):
            return False
        if _digest(self._files.read(self.directory, file_name)) == digest:
            return True
        log.warning("the exchange file %s/%s does not hold the bytes its name says; "
                    "replacing it", self.directory, file_name)
        return False

    def ship(self, data: bytes, name: str, unique: bool = True) -> Payload:
        """``data`` as a :class:`Payload` (key: content hash, plus a random suffix when
        ``unique``). Not ``unique``: the file is ``<name>-<hash>.bin``, written once (after
        checking any file already there) and kept."""
        digest = _digest(data)
        # keyed by run, so workers can evict the payloads of finished runs (live_runs)
        key = f"{self.run_key}:{digest}" + (f"-{uuid.uuid4().hex[:8]}" if unique else "")
        if not self.by_file(len(data)):
            return Payload(key, inline=data)
        assert self.directory is not None
        if not unique:
            file_name = f"{name}-{digest[:16]}.bin"
            if not self._holds(file_name, digest):
                self._write(file_name, data)
            return Payload(key, directory=self.directory, name=file_name, digest=digest)
        file_name = f"{name}-{digest[:16]}-{uuid.uuid4().hex[:8]}.bin"
        self._write(file_name, data)
        self._written.append(file_name)
        return Payload(key, directory=self.directory, name=file_name, digest=digest)

    def discard(self, payload: Payload) -> None:
        """Delete ``payload``'s file (once its job has ended)."""
        if payload.name is None or payload.name not in self._written:
            return
        try:
            self._files.delete(self.directory or "", payload.name)
        except OSError as exc:
            log.debug("could not delete %s: %s", payload.name, exc)
        self._written.remove(payload.name)

    def close(self) -> None:
        """Delete the run's directory (best effort)."""
        if self.directory is None:
            return
        try:
            self._files.delete_tree(self.directory)
        except OSError as exc:
            log.warning("could not delete the exchange directory %s: %s", self.directory, exc)
