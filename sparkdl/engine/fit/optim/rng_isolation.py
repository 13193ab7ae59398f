"""Driver code that needs torch's global random generator, without sharing it.

``nn.Module`` constructors draw their initial weights from torch's global CPU generator, and so
does a model run in training mode (dropout). Estimator fits run on parallel threads under
``CrossValidator(parallelism>1)``, so two fits seeding and drawing from that one generator would
interleave, and the initial weights would depend on thread timing. :func:`private_torch_rng`
gives a block the generator to itself: one block at a time (a lock), the generator's state
saved before and restored after, optionally seeded inside.

Example::

    with private_torch_rng(seed=7):
        model = build_model()          # the same initial weights whatever other threads do
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

__all__ = ["private_torch_rng"]

_LOCK = threading.RLock()


@contextlib.contextmanager
def private_torch_rng(seed: int | None = None) -> Iterator[None]:
    """Run the block with torch's CPU generator to itself (seeded with ``seed`` if given);
    the caller's generator state is unchanged afterwards."""
    with _LOCK, torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield
