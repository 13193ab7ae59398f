"""Who writes which checkpoint directory, and what a directory's other fits tell a fit
(driver side).

* :func:`exclusive_directory`: one fit of this process at a time in a directory; a fit whose
  own thread holds it already is refused at once (:class:`DirectoryHeldError`), never left
  waiting on itself;
* :func:`check_shared_directories`: fits of one set that would write one plain directory with
  different identities are refused before any job;
* :func:`note_settings`: each ``by_fit`` subdirectory carries a marker of its fit's settings
  (the resume key without the data) and of the process that opened it, so that a fit that finds
  no checkpoint of its own, beside fits of the same settings that another process trained over
  other data, says so once: the usual cause is a tuner whose folds changed (no fixed seed).

Example::

    check_shared_directories(fits)                    # before any job
    with exclusive_directory(path):
        note_settings(parent, directory, key, files, resumed=False)
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import threading
import uuid
from typing import Any, Iterator, Sequence

from ....errors import CheckpointError, UnidentifiableError
from ....storage.file_systems import FileSystemAccess
from .checkpointing import shown
from .content_digest import content_digest
from .fit_identity import fit_identity

__all__ = ["DirectoryHeldError", "exclusive_directory", "check_shared_directories",
           "note_settings"]

log = logging.getLogger("sparkdl")


_DIRECTORY_LOCKS: dict[str, threading.Lock] = {}
_DIRECTORY_HOLDERS: dict[str, int] = {}     # directory -> the thread holding it
_LOCKS_LOCK = threading.Lock()


class DirectoryHeldError(CheckpointError):
    """A fit asked for a checkpoint directory that its own thread already holds (another fit of
    the same set, opened first): waiting would wait for ever. :class:`sparkdl.FitSet` catches it
    and trains that fit in a later pass."""

    def __init__(self, path: str) -> None:
        super().__init__(f"The checkpoint directory {path} is held by another fit of this "
                         "thread, which has not ended: two fits of one set that write the same "
                         "directory train one after the other (FitSet does so), never at once.")
        self.path = path


@contextlib.contextmanager
def exclusive_directory(path: str) -> Iterator[None]:
    """Hold ``path`` for one fit of this process: another fit with the same directory (a grid
    whose settings differ only in what the identity leaves out, such as ``maxEpoch``, fitted in
    parallel) waits for it to end and then resumes what it wrote, instead of both writing and
    pruning one directory at once. A fit on the thread that holds it is refused at once with
    :class:`DirectoryHeldError` (it would wait on itself). Fits in other processes are not held
    off."""
    key = path.rstrip("/")
    me = threading.get_ident()
    with _LOCKS_LOCK:
        if _DIRECTORY_HOLDERS.get(key) == me:
            raise DirectoryHeldError(key)
        lock = _DIRECTORY_LOCKS.setdefault(key, threading.Lock())
    if not lock.acquire(blocking=False):
        log.info("another fit of this process writes checkpoints to %s: waiting for it to end",
                 key)
        lock.acquire()
    _DIRECTORY_HOLDERS[key] = me
    try:
        yield
    finally:
        del _DIRECTORY_HOLDERS[key]
        lock.release()


def check_shared_directories(fits: Sequence[Any]) -> None:
    """Refuse, before any job, two fits of one set that would write one plain checkpoint
    directory (``by_fit=False``) with different identities: the later one could only stop at
    the other's checkpoint. Fits of one identity may share it: they train one after the other
    (the later resumes the earlier's end). ``by_fit`` directories hold one fit each."""
    by_path: dict[str, list[int]] = {}
    for k, fit in enumerate(fits):
        setup = fit.checkpoint_setup
        if setup is not None and not setup.by_fit:
            by_path.setdefault(setup.path.rstrip("/"), []).append(k)
    for path, members in by_path.items():
        identities: list[tuple[int, dict[str, Any]]] = []
        for k in members if len(members) > 1 else ():
            for trigger in fits[k].end_trigger.walk():   # as the fit's start leaves them
                trigger.reset()
            try:
                identities.append((k, fit_identity(fits[k])))
            except UnidentifiableError:
                continue                                  # refused when that fit starts
        for k, identity in identities[1:]:
            other, theirs = identities[0]
            if theirs == identity:
                continue
            key = next(key for key in sorted(set(theirs) | set(identity))
                       if theirs.get(key) != identity.get(key))
            raise CheckpointError(
                f"Fits {other} and {k} of this set write checkpoints to the same directory "
                f"{path}, but they are different fits (they differ in {key}: "
                f"{shown(theirs.get(key))} against {shown(identity.get(key))}): the later one "
                "would find the other's checkpoints and could not resume them. Give each fit "
                "its own directory, or set_checkpoint(..., by_fit=True): one subdirectory per "
                "fit.")


_PROCESS = uuid.uuid4().hex[:12]
"""This process: markers it wrote are not another run's."""
_TOLD: set[str] = set()
"""The checkpoint directories whose other-data note was given (once a process)."""
_MARKER = "settings-"


def _settings(key: dict[str, Any]) -> str:
    """The digest of a resume key without what the data decides (its content, its partition
    sizes, the validation data)."""
    settings = {k: v for k, v in key.items() if k not in ("data", "partition_sizes")}
    validation = settings.get("validation")
    if isinstance(validation, dict):
        settings["validation"] = {k: v for k, v in validation.items() if k != "data"}
    return content_digest(settings, "the fit's settings")[:16]


def note_settings(parent: str, directory: str, key: dict[str, Any], files: FileSystemAccess,
                  resumed: bool) -> None:
    """Mark ``directory`` (a ``by_fit`` subdirectory of ``parent``) with its fit's settings
    and this process; when the fit resumed nothing, look for fits of the same settings that
    another process trained (over other data, since their directory is not this one) and say
    so, once for ``parent``."""
    mine = _settings(key)
    name = posixpath.basename(directory.rstrip("/"))
    try:
        files.mkdirs(directory)
        if not any(n.startswith(f"{_MARKER}{mine}-") for n in files.names(directory)):
            files.write(directory, f"{_MARKER}{mine}-{_PROCESS}", b"")
        if resumed or parent in _TOLD:
            return
        others = [d for d in files.names(parent) if d.startswith("fit-") and d != name]
        for other in others:
            theirs = [n for n in files.names(f"{parent}/{other}") if n.startswith(_MARKER)]
            if any(n.startswith(f"{_MARKER}{mine}-") and not n.endswith(_PROCESS)
                   for n in theirs):
                _TOLD.add(parent)
                log.warning(
                    "this fit finds no checkpoint of its own in %s, which holds fits of the "
                    "same settings over other data, written by an earlier run (%s): it trains "
                    "from the start. If the data did not change, the likely cause is a tuner "
                    "without a fixed seed: CrossValidator and TrainValidationSplit draw their "
                    "splits from a seed that changes from process to process unless seed= is "
                    "given, so every fold's data, and so its checkpoint directory, changes.",
                    parent, other)
                return
    except Exception as exc:                 # noqa: BLE001 - a note, never a failure
        log.debug("the settings marker of %s could not be used: %s", directory, exc)
