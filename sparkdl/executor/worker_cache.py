"""Caches that live in a Python worker from task to task, and the garbage collection they need
(executor side).

A reused PySpark worker keeps imported modules alive between tasks, so a module-level cache here
survives from one task (one iteration) to the next. It must live in an importable module: a dict
named by a function shipped to tasks would be pickled by value into every task (a fresh copy).

A reused worker also calls ``gc.collect()`` after every task (``pyspark/daemon.py``). A full
collection walks every tracked object, and a worker that imported torch and holds a model has
hundreds of thousands of them: measured here, the next task started ~60 ms later than in a worker
without torch, on every task of every iteration. ``gc.freeze()`` moves the objects alive now (the
torch modules, the cached model) out of the collector's reach, after which the per-task
collection only walks what tasks created since. :class:`WorkerCache` does this for the objects it
is asked to freeze.

A task that drops entries (the cleanup at a fit's end) then calls :func:`freeze_long_lived`
itself: one walk reclaims what the entries left and freezes the rest again, so neither the
worker's own collection after that task nor the next fit's first replica walks torch again.

A task that adds several entries (a pass's first iteration makes one replica per fit) wraps them
in :func:`one_freeze`: the collection then runs once when the task's entries are all in, not
once per entry (~0.12 s each in a worker holding torch).

Example::

    _MODELS: WorkerCache[torch.nn.Module] = WorkerCache(capacity=4, freeze=True)
    model = _MODELS.get_or_create(key, lambda: pickle.loads(payload))
    _MODELS.pop(key)            # gives the frozen objects back to the collector
"""

from __future__ import annotations

import contextlib
import gc
from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterator, TypeVar

__all__ = ["WorkerCache", "freeze_imports_once", "freeze_long_lived", "release_frozen",
           "one_freeze"]

V = TypeVar("V")

_deferred: list[bool] = []      # one entry per open one_freeze(): whether a freeze was asked


def freeze_long_lived() -> None:
    """Collect what is not frozen (objects made since the last freeze, and every object after a
    :func:`release_frozen`), then exempt every surviving object from later collections.

    Objects frozen earlier stay frozen: while no entry has left a cache they are all alive, so
    walking them again (~0.15 s in a worker holding torch, in every fit's first task that makes
    a replica) would find nothing to free. A cache that drops an entry releases the freeze
    first, so the next collection reclaims that entry's cycles."""
    if _deferred:
        _deferred[-1] = True
        return
    gc.collect()
    gc.freeze()


def freeze_imports_once() -> None:
    """In a Spark task's Python worker where nothing is frozen, freeze what is alive now (the
    imported modules: torch alone is ~245k objects). For tasks that cache no replica (local
    rounds, hops): without it the collection pyspark makes after each of them walks torch again,
    ~0.15 s that the worker's next task waits for. A no-op outside a Spark task (the driver's
    in-process runs)."""
    if gc.get_freeze_count() or _deferred:
        return
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        freeze_long_lived()


@contextlib.contextmanager
def one_freeze() -> Iterator[None]:
    """Within the block, the freezes that caches ask for are put off and made once, at its end
    (also when it raises: the entries added before stay cached)."""
    _deferred.append(False)
    try:
        yield
    finally:
        if _deferred.pop():
            freeze_long_lived()


def release_frozen() -> None:
    """Give frozen objects back to the collector (the next collection may free their cycles)."""
    gc.unfreeze()


class WorkerCache(Generic[V]):
    """A bounded least-recently-used cache of long-lived objects in this Python worker.

    Args:
        capacity: entries kept; the least recently used is evicted beyond it.
        freeze: after adding an entry, freeze everything alive out of the per-task garbage
            collection (:func:`freeze_long_lived`); removing an entry releases the freeze.
    """

    def __init__(self, capacity: int, freeze: bool) -> None:
        self.capacity = int(capacity)
        self.freeze = bool(freeze)
        self._entries: "OrderedDict[Hashable, V]" = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def keys(self) -> list[Hashable]:
        """The keys, least recently used first."""
        return list(self._entries)

    def get(self, key: Hashable) -> V | None:
        """The entry (now the most recently used), or None."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: V) -> V:
        """Add or replace an entry, evicting the least recently used beyond the capacity."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            if self.freeze:
                release_frozen()
        if self.freeze:
            freeze_long_lived()
        return value

    def get_or_create(self, key: Hashable, create: Callable[[], V]) -> V:
        """The entry for ``key``, made by ``create()`` on first use."""
        value = self.get(key)
        return value if value is not None else self.put(key, create())

    def pop(self, key: Hashable) -> V | None:
        """Remove an entry (releasing the freeze when this cache freezes); None if absent."""
        value = self._entries.pop(key, None)
        if value is not None and self.freeze:
            release_frozen()
        return value
