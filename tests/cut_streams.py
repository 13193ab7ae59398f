"""AllReduce sides whose output is cut short, for tests/test_allreduce_paths.py (a module of
their own: the Python workers import only it and sparkdl's transport to unpickle them)."""

from __future__ import annotations

from sparkdl.transport.allreduce import DriverMapSide, ShuffleReduceSide
from sparkdl.transport.frames import message_frames


class ReducerGone(ShuffleReduceSide):
    """A reducer of block 1 whose result never reaches the driver (nothing yielded)."""

    def __call__(self, k, frames):
        return iter(()) if k == 1 else super().__call__(k, frames)


class ReducerEmpty(ShuffleReduceSide):
    """A reducer of block 1 whose inputs were cut: a message without a sum."""

    def __call__(self, k, frames):
        if k == 1:
            list(frames)
            return message_frames((k, [], 0.0, 0.0, 0.0, {}, None), None)
        return super().__call__(k, frames)


class DriverMapGone(DriverMapSide):
    """The driver path's task of partition 1 yields nothing."""

    def __call__(self, partition, records):
        return iter(()) if partition == 1 else super().__call__(partition, records)
