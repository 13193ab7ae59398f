"""The batch plan: shares always sum to the batch, every sample once per epoch (no Spark)."""

from __future__ import annotations

import numpy as np
import pytest

from sparkdl.data.batch_plan import BatchPlan


@pytest.mark.parametrize("sizes,batch", [
    ([100], 7), ([85, 35], 32), ([50, 0, 70], 120), ([5, 30, 0, 17, 40, 1, 27], 13),
    ([1, 0, 1, 1, 0, 2, 0], 2), ([3, 3, 3], 1000), ([0, 0, 4], 3),
])
def test_every_sample_once_per_epoch_and_shares_sum_to_batch(sizes, batch):
    plan = BatchPlan(sizes, batch, seed=11)
    n = sum(sizes)
    for epoch in range(2):
        seen = []
        for step in range(plan.iterations_per_epoch):
            starts, counts = plan.shares(epoch, step)
            assert counts.sum() == plan.batch_size_at(step)
            assert (counts >= 0).all()
            seen.append(plan.global_indices(epoch, step))
        seen = np.concatenate(seen)
        assert sorted(seen.tolist()) == list(range(n))


def test_shares_are_proportional_to_partition_sizes():
    plan = BatchPlan([300, 100], 40, seed=0)
    for step in range(plan.iterations_per_epoch):
        _, counts = plan.shares(0, step)
        assert counts.tolist() == [30, 10]


def test_epochs_reshuffle_and_seeds_differ():
    a = BatchPlan([50, 50], 10, seed=1)
    b = BatchPlan([50, 50], 10, seed=2)
    assert not np.array_equal(a.global_indices(0, 0), a.global_indices(1, 0))
    assert not np.array_equal(a.global_indices(0, 0), b.global_indices(0, 0))
    assert np.array_equal(a.global_indices(1, 3), BatchPlan([50, 50], 10, 1).global_indices(1, 3))


def test_no_shuffle_visits_in_stored_order():
    plan = BatchPlan([4, 4], 4, seed=0, shuffle=False)
    assert sorted(plan.global_indices(0, 0).tolist()) == [0, 1, 4, 5]


def test_random_access_matches_sequential_walk():
    plan = BatchPlan([17, 5, 29], 6, seed=0)
    walked = [plan.shares(0, s)[0].tolist() for s in range(plan.iterations_per_epoch)]
    fresh = BatchPlan([17, 5, 29], 6, seed=0)
    jumped = [fresh.shares(0, s)[0].tolist() for s in reversed(range(plan.iterations_per_epoch))]
    assert walked == list(reversed(jumped))


def test_iteration_to_epoch_and_step():
    plan = BatchPlan([10], 3, seed=0)
    assert plan.iterations_per_epoch == 4
    assert plan.epoch_and_step(0) == (0, 0)
    assert plan.epoch_and_step(5) == (1, 1)
    assert [plan.batch_size_at(s) for s in range(4)] == [3, 3, 3, 1]


def _stored_order_shares(sizes, batch):
    """The plan as it was built before (an owner per sample of the epoch, from a stable argsort
    of the float keys (k + 1/2) / m): the reference the O(partitions) plan must equal."""
    sizes = np.asarray(sizes, dtype=np.int64)
    keys = [(np.arange(m, dtype=np.float64) + 0.5) / m for m in sizes if m > 0]
    owners = [np.full(m, i, dtype=np.int32) for i, m in enumerate(sizes) if m > 0]
    owner = (np.concatenate(owners)[np.argsort(np.concatenate(keys), kind="stable")]
             if keys else np.zeros(0, np.int32))
    n = int(sizes.sum())
    for lo in range(0, max(n, 1), batch):
        hi = min(lo + batch, n)
        starts = np.bincount(owner[:lo], minlength=len(sizes))
        yield starts, np.bincount(owner[lo:hi], minlength=len(sizes))


def _random_layouts(count, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        p = int(rng.integers(1, 50))
        kind = rng.integers(0, 4)
        if kind == 0:      # small, with empty partitions
            sizes = rng.integers(0, 30, p)
        elif kind == 1:    # skewed: a few huge partitions among tiny ones
            sizes = np.where(rng.random(p) < 0.2, rng.integers(1000, 100_000, p),
                             rng.integers(0, 3, p))
        elif kind == 2:    # equal sizes and multiples of each other: many exact ties
            sizes = int(rng.integers(1, 40)) * rng.choice([1, 2, 3, 4, 6], p)
        else:              # more partitions than samples
            sizes = (rng.random(p) < 0.3).astype(np.int64)
        n = int(sizes.sum())
        for batch in {1, 2, 7, max(1, n // 3), max(1, n), n + 5}:
            yield sizes.tolist(), batch


def test_the_partition_state_plan_gives_the_batches_of_the_stored_order():
    checked = 0
    for sizes, batch in list(_random_layouts(120)) + [([1, 100_000], 1000), ([3, 3, 3], 2),
                                                      ([2, 4, 8, 16], 5), ([0, 0, 4], 3)]:
        if sum(sizes) // batch > 3000:
            continue      # the reference's cost grows with the number of steps
        plan = BatchPlan(sizes, batch, seed=0)
        expected = list(_stored_order_shares(sizes, batch))
        assert plan.iterations_per_epoch == len(expected)
        steps = range(plan.iterations_per_epoch)
        if len(steps) > 200:    # every step's start is a prefix count: a sample of them does
            steps = sorted(set(np.random.default_rng(len(sizes)).choice(steps, 200).tolist()))
        for step in list(steps) + [0, plan.iterations_per_epoch - 1]:
            starts, counts = plan.shares(0, step)
            np.testing.assert_array_equal(starts, expected[step][0], err_msg=f"{sizes} {batch}")
            np.testing.assert_array_equal(counts, expected[step][1], err_msg=f"{sizes} {batch}")
            checked += 1
    assert checked > 3000


def test_the_plan_of_a_hundred_million_samples_takes_little_driver_memory():
    import tracemalloc

    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 200_000, 1000)
    sizes = (sizes * (100_000_000 / sizes.sum())).astype(np.int64)
    sizes[0] += 100_000_000 - int(sizes.sum())
    tracemalloc.start()
    try:
        plan = BatchPlan(sizes, 1_000_000, seed=0)
        totals = np.zeros(len(sizes), np.int64)
        for step in range(plan.iterations_per_epoch):      # 100 steps: the whole epoch
            starts, counts = plan.shares(0, step)
            assert counts.sum() == plan.batch_size_at(step)
            np.testing.assert_array_equal(starts, totals)
            totals += counts
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(totals, sizes)          # every sample once
    assert plan.num_samples == 100_000_000
    assert peak < 200 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert peak < 20 * 2**20    # in fact O(partitions): well under a megabyte per partition
