"""A rebuilt shard is checked against the original (issue: real clusters, acceptance 4): a
deterministic input rebuilds to the same weights, a nondeterministic one is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models import (ShardDroppingLoss, SmallNet, bitwise_equal, classification_data, make_rdd)
from sparkdl import DistriOptimizer, TrainingDataError
from sparkdl.triggers import MaxIteration


def train(sc, rdd, criterion):
    torch.manual_seed(3)
    net = SmallNet()
    opt = DistriOptimizer(net, rdd, criterion, torch.optim.SGD(net.parameters(), lr=0.1),
                          batch_size=20, end_trigger=MaxIteration(6), seed=2, progress_bar=False)
    return opt.optimize()


def test_a_lost_shard_of_a_deterministic_input_rebuilds_to_the_same_weights(sc, tmp_path, caplog):
    x, y = classification_data(80, seed=6)
    clean = train(sc, make_rdd(sc, list(zip(x, y)), [40, 40]), torch.nn.CrossEntropyLoss())
    marker = str(tmp_path / "dropped")
    with caplog.at_level("INFO", logger="sparkdl"):
        rebuilt = train(sc, make_rdd(sc, list(zip(x, y)), [40, 40]), ShardDroppingLoss(marker))
    assert any("ran where their shard was not" in r.getMessage() for r in caplog.records)
    assert bitwise_equal(rebuilt, clean)


def test_a_nondeterministic_input_that_rebuilds_differently_is_a_clear_error(sc, tmp_path):
    x, y = classification_data(80, seed=6)
    noisy = make_rdd(sc, list(zip(x, y)), [40, 40]).map(
        lambda r: (r[0] + np.float32(np.random.default_rng().normal()), r[1]))   # no seed
    with pytest.raises(TrainingDataError, match=r"Partition \d of the training RDD came back "
                                                r"different when its shard was rebuilt \(the same "
                                                r"number of samples with other contents\).*cache\(\)"):
        train(sc, noisy, ShardDroppingLoss(str(tmp_path / "dropped")))
