"""Executor-level aggregation: a task with several cores computes its share on sub-replicas in
threads and sums them inside the task (sparkdl.executor.sub_replicas), exactly.

Against single-process torch on the same union batches (<= 1e-5), bitwise from run to run and
through a SIGKILLed executor on local-cluster[2,2,1024] with spark.task.cpus=2; the automatic
choice falls back to one replica for models that draw random numbers or change buffers.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import multicore_job
from models import (BatchNormNet, DropoutNet, bitwise_equal, classification_data, max_abs_diff,
                    reference_train, split_sizes)
from sparkdl import DistriOptimizer
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.engine.fit.checks.task_parallelism import (choose_sub_replicas, concurrency_hazard,
                                             prefers_sub_replicas)
from sparkdl.errors import InvalidArgumentError
from sparkdl.executor.sub_replicas import sub_shares
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import MaxIteration

HERE = os.path.dirname(os.path.abspath(__file__))


def _partitions(x, y, sizes):
    return [list(zip(x[lo:hi], y[lo:hi])) for lo, hi in split_sizes(len(x), sizes)]


def test_sub_shares_are_contiguous_and_fixed():
    parts = sub_shares(np.arange(7), 3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [len(p) for p in sub_shares(np.arange(1), 3)] == [1, 0, 0]


@pytest.mark.parametrize("micro", [None, 4])
def test_sub_replicas_match_single_process_torch(micro):
    # a normalised loss (ignored targets): each sub-replica reports its own normaliser
    x, y = classification_data(130, seed=4)
    y[::9] = -100
    sizes = [50, 0, 31, 49]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    criterion = nn.CrossEntropyLoss(ignore_index=-100)

    def train(sub):
        model = copy.deepcopy(net)
        opt = DistriOptimizer(model, LocalPartitions(_partitions(x, y, sizes)), criterion,
                              torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                              batch_size=29, end_trigger=MaxIteration(12), seed=2,
                              micro_batch_size=micro, sub_replicas=sub)
        return opt.optimize()

    three, again = train(3), train(3)
    reference = reference_train(net, x, y, criterion,
                                lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                BatchPlan(sizes, 29, 2), 12)
    assert max_abs_diff(three, reference) <= 1e-5
    assert bitwise_equal(three, again)


def test_models_that_cannot_run_concurrently_are_named(caplog):
    x, y = classification_data(8, seed=1)
    inputs, target = [torch.from_numpy(x)], torch.from_numpy(y)
    torch.manual_seed(0)
    dropout = concurrency_hazard(DropoutNet(), nn.CrossEntropyLoss(), None, inputs, target)
    assert "random numbers" in dropout
    batch_norm = concurrency_hazard(BatchNormNet(), nn.CrossEntropyLoss(), None, inputs, target)
    assert "'bn.running_mean'" in batch_norm
    assert concurrency_hazard(nn.Linear(6, 3), nn.CrossEntropyLoss(), None, inputs,
                              target) is None
    # automatic: one replica with the task's threads, and says why; explicit: an error
    count, how = choose_sub_replicas(None, 4, False, lambda: dropout)
    assert count == 1 and "4 intra-op threads" in how and "random numbers" in how
    assert choose_sub_replicas(None, 4, False, lambda: None)[0] == 4
    assert choose_sub_replicas(None, 4, True, lambda: None)[0] == 1      # GPUs
    assert choose_sub_replicas(None, 1, False, lambda: None)[0] == 1
    assert choose_sub_replicas(None, 4, False, lambda: None, augments=True)[0] == 1
    count, how = choose_sub_replicas(None, 4, False, lambda: None, prefers=False)
    assert count == 1 and "without convolutions or attention" in how
    assert choose_sub_replicas(2, 4, False, lambda: None, prefers=False)[0] == 2
    assert prefers_sub_replicas(nn.Sequential(nn.Conv2d(1, 2, 3)))
    assert prefers_sub_replicas(nn.TransformerEncoderLayer(8, 2))
    assert not prefers_sub_replicas(nn.Sequential(nn.Embedding(5, 2), nn.Linear(2, 2)))
    with pytest.raises(InvalidArgumentError, match="sub_replicas=2: the model draws random"):
        choose_sub_replicas(2, 4, False, lambda: dropout)
    with pytest.raises(InvalidArgumentError, match="train_transform"):
        choose_sub_replicas(2, 4, False, lambda: None, augments=True)
    # through the engine, before any gradient is computed
    model = BatchNormNet()
    opt = DistriOptimizer(model, LocalPartitions(_partitions(x, y, [4, 4])),
                          nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                          batch_size=4, end_trigger=MaxIteration(2), sub_replicas=2)
    with pytest.raises(InvalidArgumentError, match="changes the buffer 'bn.running_mean'"):
        opt.optimize()
    assert not opt.summary.iterations
    with pytest.raises(InvalidArgumentError, match="sub_replicas"):
        DistriOptimizer(model, LocalPartitions([[(x[0], y[0])]]), nn.CrossEntropyLoss(),
                        torch.optim.SGD(model.parameters(), lr=0.1), batch_size=4,
                        sub_replicas=0)


def _run_job(out_dir, *extra):
    os.makedirs(out_dir, exist_ok=True)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "multicore_job.py"),
                           "local-cluster[2,2,1024]", str(out_dir), *extra],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("\tat ")]
        pytest.fail(f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n" + "\n".join(lines[-80:]))
    trained = {}
    for name, model in multicore_job.models().items():
        model.load_state_dict(torch.load(os.path.join(out_dir, f"{name}.pt"), weights_only=True))
        trained[name] = model
    return trained, proc


@pytest.fixture(scope="module")
def clean_multicore_run(tmp_path_factory):
    return _run_job(tmp_path_factory.mktemp("multicore-clean"))


@pytest.mark.cluster
def test_two_core_tasks_match_single_process_torch(clean_multicore_run):
    trained, proc = clean_multicore_run
    assert "executors=2" in proc.stdout
    assert proc.stderr.count("2 sub-replicas per task in threads (1 intra-op thread each)") == 3
    plan = BatchPlan(multicore_job.SIZES, multicore_job.BATCH, multicore_job.SEED)
    for name, initial in multicore_job.models().items():
        x, y = multicore_job.data(name)
        reference = reference_train(initial, x, y, nn.CrossEntropyLoss(),
                                    multicore_job.optimizer, plan, multicore_job.ITERATIONS)
        assert max_abs_diff(trained[name], reference) <= 1e-5, name
        assert not bitwise_equal(trained[name], initial), name


@pytest.mark.cluster
def test_two_core_tasks_survive_a_killed_executor_bitwise(clean_multicore_run, tmp_path):
    marker = tmp_path / "fault-marker"
    trained, proc = _run_job(tmp_path / "out", "--fault", "executor", "--marker", str(marker))
    assert marker.exists(), "no executor was killed"
    assert "mlp_iterations=10" in proc.stdout
    assert "rebuilding" in proc.stderr
    clean, _ = clean_multicore_run
    for name in clean:          # the MLP through the fault; the others: a second clean run
        assert bitwise_equal(trained[name], clean[name]), name
