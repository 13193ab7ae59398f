"""Several fits' weights in one broadcast per iteration (driver side, read in the tasks).

In a pass (:mod:`sparkdl.engine.fit_set`) every fit's
:class:`~sparkdl.transport.weight_refresh.RefreshPublisher` broadcasts its own full copies and
row deltas. A :class:`BroadcastBundle` stands in for their broadcast function during one
iteration: each value it is given gets a :class:`BundledValue` handle at once, and
:meth:`BroadcastBundle.flush` (before the job's tasks are made) sends all of them as one
broadcast, a list, and binds the handles to their places in it. A handle reads as its own value
in a task (``handle.value``); the broadcast is destroyed when every handle made from it is.

Example::

    bundle = BroadcastBundle(sc.broadcast)
    a, b = bundle(state_a), bundle(state_b)     # what two publishers send this iteration
    bundle.flush()                              # one broadcast of [state_a, state_b]
    task reads a.value                          # state_a
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["BroadcastBundle", "BundledValue"]


class _Shared:
    """One broadcast of a list of values, destroyed when its last handle is."""

    def __init__(self, broadcast: Any, handles: int) -> None:
        self.broadcast = broadcast
        self.handles = handles

    def release(self) -> None:
        self.handles -= 1
        if self.handles == 0:
            self.broadcast.destroy(blocking=False)


class BundledValue:
    """One value of a bundle: ``.value`` (in a task) is that value; ``destroy()`` releases it."""

    def __init__(self) -> None:
        self._shared: _Shared | None = None
        self._index = -1
        self._broadcast: Any = None

    def bind(self, shared: _Shared, index: int) -> None:
        self._shared, self._index, self._broadcast = shared, index, shared.broadcast

    @property
    def value(self) -> Any:
        return self._broadcast.value[self._index]

    def destroy(self, blocking: bool = False) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.release()

    def __getstate__(self) -> dict[str, Any]:      # a task gets the broadcast and the place
        assert self._broadcast is not None, "a bundled value is sent after its bundle's flush"
        return {"broadcast": self._broadcast, "index": self._index}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._shared, self._broadcast, self._index = None, state["broadcast"], state["index"]


class BroadcastBundle:
    """A broadcast function that defers: the values given until :meth:`flush` go as one
    broadcast (``broadcast``: the function that makes a real one)."""

    def __init__(self, broadcast: Callable[[Any], Any]) -> None:
        self._broadcast = broadcast
        self._pending: list[tuple[BundledValue, Any]] = []

    def __call__(self, value: Any) -> BundledValue:
        handle = BundledValue()
        self._pending.append((handle, value))
        return handle

    def flush(self) -> int:
        """Send what was given since the last flush as one broadcast; the number of values."""
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        shared = _Shared(self._broadcast([value for _, value in pending]), len(pending))
        for index, (handle, _) in enumerate(pending):
            handle.bind(shared, index)
        return len(pending)
