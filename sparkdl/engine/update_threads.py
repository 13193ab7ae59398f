"""The driver's update runs on one thread (driver side).

Everything a fit computes on the driver between two jobs (the summed gradient into ``.grad``,
the buffers' combination, clipping, the optimizer's and loss scaler's steps, a closure
optimizer's reductions) runs with ``torch.set_num_threads(1)``. Two reasons, both about the
weights being the same bits wherever the driver runs:

* torch splits a reduction (a sum, a norm, LBFGS's dot products) into one chunk per thread and
  adds the chunks' results, so its rounding depends on the driver's thread count: a run resumed
  on a driver with another number of cores would leave the interrupted run's weights;
* on this project's 2-core VMs an elementwise optimizer step on two threads was seen to give
  the OpenMP worker's half of a 21.6 M-value Adam update about 1e-4 relative away from the
  same step on one thread, in one process out of about ten under load (identical inputs,
  digests in ``tests/big_checkpoint_job.py``), while the calling thread's half never moved.

One thread makes the update a function of its inputs alone. It costs a large model's update
its intra-op parallelism (an Adam step of 21.6 M values: 183-205 ms instead of 129-135 ms on two
cores); a model of a few million values steps in milliseconds either way.

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
