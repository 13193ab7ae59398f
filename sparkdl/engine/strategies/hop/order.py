"""Which partition a hopping model visits when (driver side; model hopping,
:mod:`sparkdl.engine.strategies.hop.jobs`).

An epoch of model hopping is ``P`` sub-epochs over ``P`` partitions. Epoch ``e`` has one seeded
permutation of the partitions, shared by every model of the set; the model in rotation
``position`` visits, in sub-epoch ``s``, the partition at ``(position + s) mod P`` of that
permutation. So in every sub-epoch models whose positions differ modulo ``P`` are on different
partitions, each model visits every partition once per epoch, and its order is a function of
``(seed, epoch, position)`` alone: a model gives the same result whichever models hop beside
it (:func:`visiting_order`).

:class:`HopPlan` is the plan of one hopping fit: what the loop, its checkpoints and its log read
of a :class:`sparkdl.data.batch_plan.BatchPlan`, with one iteration = one sub-epoch.

Example::

    visiting_order(seed=0, epoch=1, position=3, num_partitions=4)   # e.g. [2, 0, 3, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["visiting_order", "HopPlan"]


def _epoch_permutation(seed: int, epoch: int, num_partitions: int) -> np.ndarray:
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0x686F70, int(epoch)])
    return np.random.default_rng(state).permutation(num_partitions)


def visiting_order(seed: int, epoch: int, position: int, num_partitions: int) -> list[int]:
    """The partitions the model in rotation ``position`` visits in epoch ``epoch`` (0-based),
    sub-epoch by sub-epoch."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1; got {num_partitions}")
    order = _epoch_permutation(seed, epoch, num_partitions)
    return [int(order[(position + s) % num_partitions]) for s in range(num_partitions)]


@dataclass(frozen=True)
class HopPlan:
    """One hopping fit's plan: ``partition_sizes`` (the training shards'), its own
    ``batch_size``, the set's hop ``seed`` and the fit's rotation ``position``. An iteration is
    one sub-epoch: ``iterations_per_epoch`` is the number of partitions."""

    partition_sizes: Sequence[int]
    batch_size: int
    seed: int
    position: int

    @property
    def num_partitions(self) -> int:
        return len(self.partition_sizes)

    @property
    def num_samples(self) -> int:
        return int(sum(self.partition_sizes))

    @property
    def iterations_per_epoch(self) -> int:
        return self.num_partitions

    @property
    def strategy(self) -> str:
        """What the fit's checkpoints record of how it trains (a hop checkpoint resumes only
        the same seed and position)."""
        return f"hop(seed={self.seed}, position={self.position})"

    def partition_at(self, iteration: int) -> int:
        """The partition of sub-epoch ``iteration`` (0-based, counted over the whole run)."""
        epoch, step = divmod(iteration, self.num_partitions)
        return visiting_order(self.seed, epoch, self.position, self.num_partitions)[step]
