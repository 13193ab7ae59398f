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

Example::

    plan = BatchPlan([100, 50, 0], batch_size=32, seed=0)
    plan.iterations_per_epoch          # 5
    plan.shares(epoch=0, step=0)       # (starts, counts) per partition, counts sum to 32
    plan.global_indices(0, 0)          # the union batch as indices into the concatenated data
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["BatchPlan", "local_permutation", "task_seed"]


def task_seed(seed: int, iteration: int, partition: int) -> int:
    """The torch seed of one task (dropout and other random layers), from the run's seed."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, iteration, partition])
    return int(state.generate_state(1, dtype=np.uint64)[0] & 0x7FFFFFFFFFFFFFFF)


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
        keys = [(np.arange(m, dtype=np.float64) + 0.5) / m for m in sizes if m > 0]
        owners = [np.full(m, i, dtype=np.int32) for i, m in enumerate(sizes) if m > 0]
        if keys:
            order = np.argsort(np.concatenate(keys), kind="stable")
            self._owner = np.concatenate(owners)[order]
        else:
            self._owner = np.zeros(0, dtype=np.int32)
        self._cursor: tuple[int, np.ndarray] = (0, np.zeros(self.num_partitions, np.int64))

    def epoch_and_step(self, iteration: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of a 0-based global iteration number."""
        return divmod(int(iteration), self.iterations_per_epoch)

    def batch_size_at(self, step: int) -> int:
        """Number of samples in step ``step`` of any epoch (only the last step may be smaller)."""
        return min(self.batch_size, self.num_samples - step * self.batch_size)

    def _window_counts(self, lo: int, hi: int) -> np.ndarray:
        return np.bincount(self._owner[lo:hi], minlength=self.num_partitions).astype(np.int64)

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
        if cursor_step == step:
            starts = cursor_starts
        else:
            starts = self._window_counts(0, lo)
        counts = self._window_counts(lo, hi)
        self._cursor = (step + 1, starts + counts)
        return starts.copy(), counts

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
