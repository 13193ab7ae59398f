"""Acceptance 1: the engine equals plain single-process PyTorch on the same union batches."""

from __future__ import annotations

import pytest
import torch

from models import (SmallNet, classification_data, make_rdd, max_abs_diff, reference_train)
from sparkdl import DistriOptimizer
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.triggers import MaxIteration

N = 120
LAYOUTS = {
    "1-partition": [120],
    "2-uneven": [85, 35],
    "3-with-empty": [50, 0, 70],
    "7-uneven-with-empty": [5, 30, 0, 17, 40, 1, 27],
}


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def step_lr(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


OPTIMIZERS = {
    "sgd-momentum-wd": (sgd, None, "epoch"),
    "adam-steplr-per-epoch": (adam, step_lr, "epoch"),
    "adam-exponential-per-iteration": (
        adam, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9), "iteration"),
}


def run_both(sc, sizes, batch_size, iterations, optimizer_name, seed=3):
    make_opt, make_sched, sched_step = OPTIMIZERS[optimizer_name]
    n = sum(sizes)
    x, y = classification_data(n, seed=seed)
    torch.manual_seed(seed)
    initial = SmallNet()
    net = SmallNet()
    net.load_state_dict(initial.state_dict())
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = make_opt(net)
    scheduler = make_sched(optimizer) if make_sched else None
    rdd = make_rdd(sc, list(zip(x, y)), sizes)
    engine = DistriOptimizer(net, rdd, criterion, optimizer, batch_size=batch_size,
                             end_trigger=MaxIteration(iterations), seed=seed,
                             lr_scheduler=scheduler, lr_scheduler_step=sched_step)
    trained = engine.optimize()
    plan = BatchPlan(sizes, batch_size, seed)
    reference = reference_train(initial, x, y, criterion, make_opt, plan, iterations,
                                make_sched, sched_step)
    return trained, reference, engine


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("optimizer_name", ["sgd-momentum-wd", "adam-steplr-per-epoch"])
def test_mini_batch_equals_single_process(sc, layout, optimizer_name):
    # 32 does not divide 120: 4 iterations per epoch, the last one of 24 samples; 6 iterations
    # cross an epoch boundary (new shuffles, a scheduler step).
    trained, reference, engine = run_both(sc, LAYOUTS[layout], 32, 6, optimizer_name)
    assert len(engine.summary.iterations) == 6
    assert [r.records for r in engine.summary.iterations] == [32, 32, 32, 24, 32, 32]
    assert max_abs_diff(trained, reference) <= 1e-5


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("optimizer_name", ["sgd-momentum-wd", "adam-exponential-per-iteration"])
def test_full_batch_equals_single_process(sc, layout, optimizer_name):
    trained, reference, _ = run_both(sc, LAYOUTS[layout], N, 3, optimizer_name)
    assert max_abs_diff(trained, reference) <= 1e-5


@pytest.mark.parametrize("optimizer_name", ["sgd-momentum-wd", "adam-steplr-per-epoch"])
def test_dataset_smaller_than_partition_count(sc, optimizer_name):
    sizes = [1, 0, 1, 1, 0, 2, 0]  # 5 samples in 7 partitions
    trained, reference, _ = run_both(sc, sizes, 2, 5, optimizer_name)
    assert max_abs_diff(trained, reference) <= 1e-5


def test_training_moves_the_weights(sc):
    """Guards the equivalence tests: the compared weights really changed from the start."""
    torch.manual_seed(3)
    start = SmallNet()
    trained, _, _ = run_both(sc, LAYOUTS["2-uneven"], 32, 6, "sgd-momentum-wd")
    assert max_abs_diff(trained, start) > 1e-2
