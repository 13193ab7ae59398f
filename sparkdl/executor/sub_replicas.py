"""A task's share computed on several sub-replicas in threads (executor side; BigDL's one task
per node).

A task that owns ``c`` cores can use them as intra-op torch threads on one replica, or run
``S`` copies of the model ("sub-replicas") in Python threads, each on a contiguous ``1/S`` of the
task's share with ``c // S`` intra-op threads, and sum their vectors inside the task, so the
AllReduce and the driver see one vector per task (per executor, with one task per executor)
instead of one per core. Which is faster depends on the model (``bench/task_aggregation.py``:
small convolutions and MLPs gain from sub-replicas, large matmuls already use both cores).

Exactness: the split (:func:`sub_shares`) depends only on the share and ``S``, a fixed setting
of the run, and the vectors are summed in sub-replica order, never in the order the threads
finish, so the sum is the same on any executor, in any retry. Sub-replicas run concurrently, so
they may not draw random numbers (torch's generator is one per process) nor change buffers; the
driver checks both before training (:mod:`sparkdl.engine.fit.checks.task_parallelism`).

Example::

    parts = sub_shares(indices, 2)                     # two contiguous halves
    results = run_sub_replicas([lambda: work(0), lambda: work(1)])   # in order
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Sequence, TypeVar

import numpy as np

__all__ = ["sub_shares", "run_sub_replicas"]

T = TypeVar("T")

_POOL: list[ThreadPoolExecutor] = []     # this worker's pool, kept from task to task


def sub_shares(indices: np.ndarray, sub_replicas: int) -> list[np.ndarray]:
    """``indices`` in ``sub_replicas`` contiguous parts whose sizes differ by at most one (the
    first parts the larger); parts may be empty when the share is smaller than ``sub_replicas``."""
    return np.array_split(indices, max(1, int(sub_replicas)))


def _pool(width: int) -> ThreadPoolExecutor:
    if not _POOL or _POOL[0]._max_workers < width:      # grow once; threads are reused
        if _POOL:
            _POOL.pop().shutdown(wait=True)
        _POOL.append(ThreadPoolExecutor(width, thread_name_prefix="sparkdl-sub-replica"))
    return _POOL[0]


def run_sub_replicas(work: Sequence[Callable[[], T]]) -> list[T]:
    """Run every callable concurrently (one thread each; the first in the calling thread) and
    return their results in the order given. An exception in any is raised here."""
    if len(work) <= 1:
        return [w() for w in work]
    futures = [_pool(len(work) - 1).submit(w) for w in work[1:]]
    try:
        first = work[0]()
    finally:                    # no thread still computes when this returns or raises
        wait(futures)
    return [first] + [f.result() for f in futures]
