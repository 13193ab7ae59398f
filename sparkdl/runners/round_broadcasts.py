"""What a local round ships to its tasks on a SparkContext (driver side): each fit's bundle
(model, optimizer, scheduler, clipping) once, each round's weights in one broadcast, and, only
when a partition's state has to be rebuilt, the replay's weights
(:mod:`sparkdl.engine.strategies.rounds`). The partitions' optimizer states never pass
through the driver: they stay beside the shards (:mod:`sparkdl.executor.round_states`).

Under ``spark.io.encryption.enabled`` everything is broadcast as bytes: pyspark's encrypted
broadcast cannot write the buffers a numpy array pickles into; otherwise the weights go as the
array itself (no copy of it on the driver).

Example::

    shipped = RoundBroadcasts(sc)
    tasks, held = shipped.tasks(data_key, entries, live, run_keys)
    try:
        ...                                  # the round's job
    finally:
        shipped.drop(held)
"""

from __future__ import annotations

from typing import Any, Sequence

from ..executor.round_task import RoundTask
from ..transport.python_jobs import PythonJobs

__all__ = ["RoundBroadcasts"]


class RoundBroadcasts:
    """The rounds' broadcasts of one runner (see the module docstring)."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc
        self._bundles: dict[int, Any] = {}

    def tasks(self, data_key: str, entries: Sequence[Any], live: Any,
              run_keys: Sequence[str | None]) -> tuple[list[RoundTask], list[Any]]:
        """Each entry's (:class:`~sparkdl.runners.interface.RoundEntry`) round task (its fit's
        run key: ``run_keys``, by entry), and the broadcasts of this round alone (for
        :meth:`drop` once the job ended)."""
        broadcast = PythonJobs.of(self.sc).broadcast
        tasks, held = [], []
        for entry, run_key in zip(entries, run_keys):
            if entry.fit not in self._bundles:
                self._bundles[entry.fit] = broadcast(entry.bundle)
            start = broadcast(entry.start.tobytes() if self.sc._encryption_enabled
                              else entry.start)    # no copy: pieces or a file take the array
            replay = None if entry.replay is None else broadcast(entry.replay)
            held += [start] + ([] if replay is None else [replay])
            tasks.append(RoundTask(data_key, entry.spec, self._bundles[entry.fit], start,
                                   replay, live=live, run_key=run_key))
        return tasks, held

    @staticmethod
    def drop(held: list[Any]) -> None:
        """Destroy one round's broadcasts."""
        for value in held:
            value.destroy(blocking=False)

    def release(self, fit: int) -> None:
        """Destroy one fit's bundle."""
        bundle = self._bundles.pop(fit, None)
        if bundle is not None:
            bundle.destroy(blocking=False)

    def close(self) -> None:
        """Destroy every fit's bundle."""
        for fit in list(self._bundles):
            self.release(fit)
