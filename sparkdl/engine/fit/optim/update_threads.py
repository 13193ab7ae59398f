"""The driver's update runs on one thread (driver side).

Everything a fit computes on the driver between two jobs (the summed gradient into ``.grad``,
the buffers' combination, clipping, the optimizer's and loss scaler's steps, a closure
optimizer's reductions, the scheduler) runs with ``torch.set_num_threads(1)``, so that the
update is a function of its inputs alone, wherever the driver runs:

* torch splits a reduction (a sum, LBFGS's dot products) into one chunk per thread and adds
  the chunks' results, so its rounding depends on the driver's thread count: a run resumed on
  a driver with another number of cores would leave the interrupted run's weights
  (``tests/test_determinism.py``);
* on this project's 2-core VMs, under load, about one process in ten gave the OpenMP worker's
  half of a 21.6 M-value Adam step values about 1e-4 relative away from the same step's on the
  calling thread, from identical inputs (digests in ``tests/big_checkpoint_job.py``). Why is not
  known (the same kernels give the same bits in every other run and under every ATen CPU
  capability); on one thread no worker computes, so the driver's update cannot meet it. Tasks
  compute on ``spark.task.cpus`` threads (one by default), so they can meet it only when that is
  more than one.

One thread costs a large model's update its intra-op parallelism (an Adam step of 21.6 M values:
183-205 ms instead of 129-135 ms on two cores); a model of a few million values steps in
milliseconds either way.

Example::

    with one_update_thread():
        optimizer.step()
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["one_update_thread"]


@contextlib.contextmanager
def one_update_thread() -> Iterator[None]:
    """Run the block with torch on one intra-op thread; the count before is restored after."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
