"""How each global mini-batch is split across the partitions of the training data.

The rule (fixed, so that runs are reproducible and comparable with single-process PyTorch):

* An epoch is one pass over all ``n`` samples: ``ceil(n / batch_size)`` iterations; every
  iteration takes ``batch_size`` samples except the last of an epoch, which takes the rest
  (PyTorch's ``DataLoader(drop_last=False)``).
* Each partition shuffles its own samples once per epoch with a generator seeded by
  ``(seed, epoch, partition)``.
* The ``n`` samples of an epoch are laid in one fixed interleaved order in which every partition
  appears at its proportional rate (the k-th sample of a partition of size ``m`` sits at
  ``(k + 1/2) / m``, ties broken by partition index). Global batch ``j`` is the window
  ``[j * batch_size, (j + 1) * batch_size)`` of that order, so a partition's share of a batch is
  its proportional share of the global batch, the shares always sum to the batch size, and every
  sample is seen exactly once per epoch, whatever the partition sizes (uneven, empty, or more
  partitions than samples).
* The plan keeps only per-partition state: a partition's share of any window is counted with
  exact integer arithmetic (:meth:`BatchPlan.prefix_counts`), so the driver's memory and time
  per step grow with the number of partitions, not samples (10^8 samples in 1,000 partitions:
  well under 1 MiB). Keys are compared exactly; the plan before compared float64 keys, which is
  the same order unless two partitions of more than ~10^7 samples each have keys closer than
  float64 resolution.

Example::

    plan = BatchPlan([100, 50, 0], batch_size=32, seed=0)
    plan.iterations_per_epoch          # 5
    plan.shares(epoch=0, step=0)       # (starts, counts) per partition, counts sum to 32
    plan.global_indices(0, 0)          # the union batch as indices into the concatenated data
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np

__all__ = ["BatchPlan", "local_permutation", "task_seed"]


def task_seed(seed: int, iteration: int, partition: int) -> int:
    """The torch seed of one task (dropout and other random layers), from the run's seed."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, iteration, partition])
    return int(state.generate_state(1, dtype=np.uint64)[0]) & 0x7FFFFFFFFFFFFFFF


def transform_generator(seed: int, iteration: int, partition: int) -> np.random.Generator:
    """The numpy generator a task hands the ``train_transform`` (augmentation) of its share of
    iteration ``iteration``: seeded by ``(seed, iteration, partition)`` only, so every retry and
    every run with the same seed draws the same augmentations.

    Example (what a single-process reference does for partition ``p``'s share)::

        x_p = train_transform(x[plan.local_indices(epoch, step, p)],
                              transform_generator(seed, iteration, p))
    """
    return np.random.default_rng(
        np.random.SeedSequence([int(seed) & 0xFFFFFFFF, iteration, partition, 0x61756721]))


def local_permutation(num_samples: int, seed: int, epoch: int, partition: int,
                      shuffle: bool = True) -> np.ndarray:
    """The order in which partition ``partition`` visits its samples during ``epoch``."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, epoch, partition])
    return rng.permutation(num_samples).astype(np.int64, copy=False)


def _exact_key_order(odd: np.ndarray, twice_m: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """The order of the keys ``odd / twice_m`` (ties by ``owner``, the partition index): by
    their float64 values, with any run of equal floats re-sorted exactly (distinct keys of
    partitions above ~10^7 samples can round to one float)."""
    keys = odd / twice_m
    order = np.lexsort((owner, keys))
    sorted_keys = keys[order]
    ties = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if len(ties) == 0:
        return order
    # runs of equal floats: [start, end) in sorted positions
    starts = ties[np.concatenate([[True], ties[1:] != ties[:-1] + 1])]
    ends = ties[np.concatenate([ties[1:] != ties[:-1] + 1, [True]])] + 2
    for start, end in zip(starts.tolist(), ends.tolist()):
        members = order[start:end]
        fractions = [Fraction(int(odd[j]), int(twice_m[j])) for j in members]
        if len(set(fractions)) > 1:      # a false tie: order these few exactly
            ranked = sorted(range(len(members)), key=lambda q: (fractions[q],
                                                                int(owner[members[q]])))
            order[start:end] = members[ranked]
    return order


class BatchPlan:
    """The split of every global batch over partitions (see the module docstring for the rule).

    Args:
        partition_sizes: number of samples in each partition, in partition order.
        batch_size: the global batch size.
        seed: seeds the per-partition shuffles.
        shuffle: when false, partitions are visited in their stored order every epoch.
    """

    def __init__(self, partition_sizes: Sequence[int], batch_size: int, seed: int,
                 shuffle: bool = True) -> None:
        sizes = np.asarray(list(partition_sizes), dtype=np.int64)
        if sizes.ndim != 1 or (sizes < 0).any():
            raise ValueError(f"partition sizes must be non-negative counts, got {sizes.tolist()}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.partition_sizes = sizes
        self.num_partitions = len(sizes)
        self.num_samples = int(sizes.sum())
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.iterations_per_epoch = max(1, math.ceil(self.num_samples / self.batch_size))
        self._sizes = [int(m) for m in sizes]
        self._cursor: tuple[int, np.ndarray] = (0, np.zeros(self.num_partitions, np.int64))

    def epoch_and_step(self, iteration: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of a 0-based global iteration number."""
        return divmod(int(iteration), self.iterations_per_epoch)

    def batch_size_at(self, step: int) -> int:
        """Number of samples in step ``step`` of any epoch (only the last step may be smaller)."""
        return min(self.batch_size, self.num_samples - step * self.batch_size)

    def _below(self, position: int) -> np.ndarray:
        """Per partition, how many of its keys ``(2k + 1) / (2m)`` are below the rational
        ``position / n``: the odd numbers ``o`` with ``o * n < 2 * m * position``, at most ``m``
        (exact integer arithmetic; Python integers where int64 could overflow)."""
        n, sizes = self.num_samples, self.partition_sizes
        if 2 * int(sizes.max(initial=0)) * position < 2**62:
            return np.minimum(sizes, -(-2 * sizes * position // n) // 2)
        return np.array([min(m, -(-2 * m * position // n) // 2) for m in self._sizes], np.int64)

    def prefix_counts(self, position: int) -> np.ndarray:
        """Per partition, how many of its samples lie among the first ``position`` of the
        epoch's interleaved order (O(partitions) memory and time, whatever the data size)."""
        n, p = self.num_samples, self.num_partitions
        if position >= n:
            return self.partition_sizes.copy()
        if position <= 0:
            return np.zeros(p, np.int64)
        # A partition's count of keys below t is within 1/2 of m * t, so the prefix's last key
        # lies in [(position - r) / n, (position + r) / n] with r = p/2 + 1. Keys below the
        # lower bound all count; the few between the bounds are ordered exactly.
        r = p // 2 + 1
        low = self._below(max(0, position - r))
        high = self._below(min(n, position + r))
        counts = low.copy()
        needed = position - int(counts.sum())
        between = high - low
        owner = np.repeat(np.arange(p), between)
        k = low[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(between) - between, between)
        odd, twice_m = 2 * k + 1, 2 * self.partition_sizes[owner]
        order = _exact_key_order(odd, twice_m, owner)
        np.add.at(counts, owner[order[:needed]], 1)
        return counts

    def shares(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Per partition: where its share of batch ``step`` starts in its epoch order, and its size.

        The epoch does not change the shares (only the per-partition order), but is part of the
        signature so callers never mix steps of different epochs.
        """
        del epoch
        if not 0 <= step < self.iterations_per_epoch:
            raise ValueError(f"step {step} is outside 0..{self.iterations_per_epoch - 1}")
        lo = step * self.batch_size
        hi = min(lo + self.batch_size, self.num_samples)
        cursor_step, cursor_starts = self._cursor
        starts = cursor_starts if cursor_step == step else self.prefix_counts(lo)
        ends = self.prefix_counts(hi)
        self._cursor = (step + 1, ends)
        return starts.copy(), ends - starts

    def local_indices(self, epoch: int, step: int, partition: int) -> np.ndarray:
        """Indices, within partition ``partition``, of its share of batch ``step`` of ``epoch``."""
        starts, counts = self.shares(epoch, step)
        perm = local_permutation(int(self.partition_sizes[partition]), self.seed, epoch,
                                 partition, self.shuffle)
        return perm[starts[partition]:starts[partition] + counts[partition]]

    def global_indices(self, epoch: int, step: int) -> np.ndarray:
        """The union batch of ``step`` in ``epoch``, as indices into the partitions concatenated
        in partition order (what a single-process reference run trains on)."""
        parts = [self.offsets[i] + self.local_indices(epoch, step, i)
                 for i in range(self.num_partitions)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
