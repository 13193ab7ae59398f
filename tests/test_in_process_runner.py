"""The loop without Spark: the in-process runner gives bitwise the weights of the Spark runner on
the same data and partitioning (issue: the loop behind one seam)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models import (BatchNormNet, DropoutNet, SmallNet, TwoInputNet, bitwise_equal,
                    classification_data, make_rdd, split_sizes)
from sparkdl import DistriOptimizer, InvalidArgumentError, Loss, Top1Accuracy
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import EveryEpoch, MaxIteration, SeveralIteration

SIZES = [45, 20, 35]


def local_partitions(records, sizes):
    return LocalPartitions([records[lo:hi] for lo, hi in split_sizes(len(records), sizes)])


def train(data, net_class, iterations=6, validation=None, **kwargs):
    torch.manual_seed(11)
    net = net_class()
    opt = DistriOptimizer(net, data, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9),
                          batch_size=16, end_trigger=MaxIteration(iterations), seed=3,
                          progress_bar=False, **kwargs)
    if validation is not None:
        opt.set_validation(validation, SeveralIteration(3), [Top1Accuracy(), Loss()])
    return opt.optimize(), opt


@pytest.mark.parametrize("net_class,allreduce", [(SmallNet, "shuffle"), (BatchNormNet, "driver"),
                                                 (DropoutNet, "auto")])
def test_in_process_run_is_bitwise_equal_to_the_spark_run(sc, net_class, allreduce):
    x, y = classification_data(sum(SIZES), d=6, seed=2)
    records = list(zip(x, y))
    on_spark, spark_opt = train(make_rdd(sc, records, SIZES), net_class, allreduce=allreduce)
    in_process, local_opt = train(local_partitions(records, SIZES), net_class)
    assert bitwise_equal(on_spark, in_process)
    assert [r.loss for r in spark_opt.summary.iterations] == \
        [r.loss for r in local_opt.summary.iterations]


def test_validation_and_bf16_compression_match_too(sc):
    x, y = classification_data(140, seed=4)
    train_records, val_records = list(zip(x[:100], y[:100])), list(zip(x[100:], y[100:]))
    on_spark, spark_opt = train(make_rdd(sc, train_records, [60, 40]), BatchNormNet,
                                validation=make_rdd(sc, val_records, [25, 15]),
                                compression="bf16")
    in_process, local_opt = train(local_partitions(train_records, [60, 40]), BatchNormNet,
                                  validation=local_partitions(val_records, [25, 15]),
                                  compression="bf16")
    assert bitwise_equal(on_spark, in_process)
    assert [v.metrics for v in spark_opt.summary.validations] == \
        [v.metrics for v in local_opt.summary.validations]
    assert len(local_opt.summary.validations) == 2


def test_multi_input_records_and_the_callers_random_state(sc):
    rng = np.random.default_rng(0)
    records = [((rng.normal(size=3).astype(np.float32), rng.normal(size=2).astype(np.float32)),
                int(rng.integers(2))) for _ in range(60)]
    on_spark, _ = train(make_rdd(sc, records, [30, 30]), TwoInputNet, iterations=5)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    threads = torch.get_num_threads()
    torch.manual_seed(11)
    net = TwoInputNet()
    torch.set_rng_state(before)
    DistriOptimizer(net, local_partitions(records, [30, 30]), torch.nn.CrossEntropyLoss(),
                    torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9), batch_size=16,
                    end_trigger=MaxIteration(5), seed=3, progress_bar=False).optimize()
    assert bitwise_equal(on_spark, net)
    assert torch.equal(torch.get_rng_state(), before)      # the tasks drew from their own state
    assert torch.get_num_threads() == threads


def test_bad_records_and_checkpoints_get_clear_errors(tmp_path):
    from sparkdl import TrainingDataError

    net = SmallNet()
    bad = LocalPartitions([[(np.ones(6, np.float32), 0)], [("text", 1)]])
    opt = DistriOptimizer(net, bad, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=2)
    with pytest.raises(TrainingDataError, match=r"record 0 of partition 1"):
        opt.optimize()
    with pytest.raises(InvalidArgumentError, match=r"must be a non-empty directory path"):
        opt.set_checkpoint("", EveryEpoch())
    with pytest.raises(InvalidArgumentError, match=r"LocalPartitions"):
        DistriOptimizer(net, [[(np.ones(6), 0)]], torch.nn.CrossEntropyLoss(),
                        torch.optim.SGD(net.parameters(), lr=0.1), batch_size=2)
