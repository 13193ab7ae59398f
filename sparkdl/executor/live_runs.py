"""Which runs are live, so every Python worker can evict what finished runs left behind.

The driver names every run and data set with :func:`new_key` (the key holds its creation time)
and releases the name when the run ends. Every task carries a :class:`LiveRuns` snapshot; before
it works, the worker drops the replicas, shards (memory and files) and exchange payloads of
every key that is not live and is older than the snapshot (a key made after the snapshot may
belong to a run that has just started). So workers that the best-effort cleanup job misses are
cleaned by the next task of any run; nothing of a finished run outlives the next job.

Example::

    key = new_key("run")                     # driver: registered as live
    task = GradientTask(..., live=live_runs())
    evict_finished(task.live)                # worker, at the start of the task
    release_key(key)                         # driver: the run ended
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass

__all__ = ["LiveRuns", "new_key", "release_key", "live_runs", "evict_finished", "held_keys"]

_LIVE: set[str] = set()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class LiveRuns:
    """The driver's live keys at ``taken_ms`` (milliseconds since the epoch)."""

    keys: frozenset[str]
    taken_ms: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_key(prefix: str) -> str:
    """A fresh key ``<prefix>-<creation ms, hex>-<random>``, registered as live."""
    key = f"{prefix}-{_now_ms():x}-{uuid.uuid4().hex[:8]}"
    with _LOCK:
        _LIVE.add(key)
    return key


def release_key(key: str) -> None:
    """The run or data set ``key`` ended: workers may evict what it left."""
    with _LOCK:
        _LIVE.discard(key)


def live_runs() -> LiveRuns:
    """A snapshot of the live keys, for a task to carry."""
    with _LOCK:
        return LiveRuns(frozenset(_LIVE), _now_ms())


def _created_ms(key: str) -> int | None:
    parts = key.rsplit("-", 2)
    try:
        return int(parts[-2], 16) if len(parts) == 3 else None
    except ValueError:
        return None


def _finished(key: str, live: LiveRuns) -> bool:
    if key in live.keys:
        return False
    created = _created_ms(key)
    return created is not None and created < live.taken_ms


def held_keys() -> dict[str, list[str]]:
    """What this worker holds, by kind (for tests and diagnostics)."""
    from . import exchange, replicas, shard_store

    root = shard_store.shard_root()
    on_disk = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return {"replicas": sorted({k[0] for k in replicas._REPLICAS.keys()}),
            "shards": sorted({k[0] for k in shard_store._SHARDS.keys()} | set(on_disk)),
            "payloads": sorted({str(k).split(":", 1)[0] for k in exchange._READ.keys()})}


def evict_finished(live: LiveRuns | None) -> None:
    """Drop this worker's replicas, shards and payloads of runs that ``live`` says ended."""
    if live is None:
        return
    from . import shard_store

    # a worker that never imported the replicas or exchange modules holds none of theirs:
    # importing them here would import torch into a worker that builds shards only
    replicas = sys.modules.get(f"{__package__}.replicas")
    exchange = sys.modules.get(f"{__package__}.exchange")
    for run_key in {k[0] for k in replicas._REPLICAS.keys()} if replicas else ():
        if _finished(run_key, live):
            replicas.drop_replica(run_key)
    root = shard_store.shard_root()
    on_disk = os.listdir(root) if os.path.isdir(root) else []
    for data_key in {k[0] for k in shard_store._SHARDS.keys()} | set(on_disk):
        if _finished(data_key, live):
            shard_store.drop_run(data_key)
    for key in list(exchange._READ.keys()) if exchange else ():
        if _finished(str(key).split(":", 1)[0], live):
            exchange._READ.pop(key)
