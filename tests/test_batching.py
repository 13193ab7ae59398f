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
