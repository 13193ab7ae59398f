"""Checkpoints, resume, NaN handling (issue: training that survives failures)."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from models import SmallNet, bitwise_equal, classification_data, make_rdd
from sparkdl import CheckpointError, DistriOptimizer, NonFiniteError
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.triggers import MaxIteration, SeveralIteration

SIZES = [40, 35]


def build(sc, iterations, records=None, seed=2, net=None):
    if records is None:
        x, y = classification_data(sum(SIZES), seed=1)
        records = list(zip(x, y))
    torch.manual_seed(3)
    net = net or SmallNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    return DistriOptimizer(net, make_rdd(sc, records, SIZES), torch.nn.CrossEntropyLoss(),
                           optimizer, batch_size=20, end_trigger=MaxIteration(iterations),
                           seed=seed, lr_scheduler=scheduler)


def checkpoint_files(path):
    return sorted(f for f in os.listdir(path) if f.startswith("checkpoint-"))


def test_checkpoints_are_complete_atomic_and_pruned(sc, tmp_path):
    opt = build(sc, 7).set_checkpoint(str(tmp_path), SeveralIteration(2), keep_last=2)
    trained = opt.optimize()
    assert checkpoint_files(tmp_path) == ["checkpoint-0000000004.pt", "checkpoint-0000000006.pt"]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".checkpoint-")]
    state = torch.load(tmp_path / "checkpoint-0000000006.pt", weights_only=True)
    assert state["iteration"] == 6 and state["epoch"] == 1
    assert set(state) >= {"model_state", "optimizer_state", "scheduler_state", "torch_rng_state",
                          "summary_records", "run"}
    # the summary is not re-serialised into every checkpoint: append-only parts beside them
    assert state["summary_records"] == [6, 0] and "summary" not in state
    parts = sorted(f for f in os.listdir(tmp_path) if f.startswith("summary-"))
    assert [p[:18] for p in parts] == ["summary-0000000002", "summary-0000000004",
                                       "summary-0000000006"]
    assert state["summary_parts"] == parts        # named by content, listed by the checkpoint
    assert [len(torch.load(tmp_path / p, weights_only=True)["iterations"]) for p in parts] == \
        [2, 2, 2]
    assert state["scheduler_state"]["last_epoch"] == 1
    assert len(state["optimizer_state"]["state"]) == 4  # Adam moments of the 4 tensors
    assert not bitwise_equal(trained, trained.__class__())  # sanity


@pytest.mark.parametrize("uri", [False, True])
def test_resume_ends_bitwise_equal_to_an_uninterrupted_run(sc, tmp_path, uri):
    path = ("file://" if uri else "") + str(tmp_path)
    uninterrupted = build(sc, 9).optimize()
    first = build(sc, 5).set_checkpoint(path, SeveralIteration(2))
    first.optimize()  # stops after 5; newest checkpoint is at 4
    second = build(sc, 9).set_checkpoint(path, SeveralIteration(2))
    resumed = second.optimize()
    assert bitwise_equal(resumed, uninterrupted)
    assert [r.iteration for r in second.summary.iterations] == list(range(1, 10))


def test_resume_after_the_end_trains_nothing(sc, tmp_path):
    done = build(sc, 4).set_checkpoint(str(tmp_path), SeveralIteration(2))
    final = copy.deepcopy(done.optimize())
    again = build(sc, 4).set_checkpoint(str(tmp_path), SeveralIteration(2))
    assert bitwise_equal(again.optimize(), final)
    assert len(again.summary.iterations) == 4


def test_non_finite_loss_stops_with_the_iteration_and_keeps_the_last_good_weights(sc, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(sum(SIZES), 6)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    poisoned = 50  # in partition 1: (1e25 * w)^2 overflows float32, the loss becomes inf
    x[poisoned] = np.float32(1e25)
    plan = BatchPlan(SIZES, 20, 2)
    first_use = next(t for t in range(20)
                     if poisoned in plan.global_indices(*plan.epoch_and_step(t)))
    assert first_use > 0, "the test needs at least one good iteration first"
    torch.manual_seed(0)
    net = torch.nn.Linear(6, 1)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.MSELoss(),
                          torch.optim.SGD(net.parameters(), lr=0.01), batch_size=20, seed=2,
                          end_trigger=MaxIteration(20))
    opt.set_checkpoint(str(tmp_path), SeveralIteration(50))
    with pytest.raises(NonFiniteError, match=rf"Training stopped at iteration {first_use + 1}: "
                                             r"the loss is inf") as info:
        opt.optimize()
    err = info.value
    assert err.iteration == first_use + 1
    assert len(opt.summary.iterations) == first_use
    assert all(torch.isfinite(v).all() for v in err.state_dict.values())
    assert all(torch.equal(err.state_dict[k], v) for k, v in net.state_dict().items())
    assert err.checkpoint and err.checkpoint.endswith(f"checkpoint-{first_use:010d}.pt")
    saved = torch.load(err.checkpoint, weights_only=True)
    assert all(torch.equal(saved["model_state"][k], v) for k, v in err.state_dict.items())


def test_corrupt_checkpoint_is_a_clear_error(sc, tmp_path):
    (tmp_path / "checkpoint-0000000002.pt").write_bytes(b"not a torch file")
    opt = build(sc, 4).set_checkpoint(str(tmp_path), SeveralIteration(2))
    with pytest.raises(CheckpointError, match=r"checkpoint-0000000002\.pt is corrupt or not a "
                                              r"sparkdl checkpoint"):
        opt.optimize()
    assert opt.summary.iterations == []


def test_checkpoint_of_another_model_is_refused(sc, tmp_path):
    build(sc, 2).set_checkpoint(str(tmp_path), SeveralIteration(2)).optimize()
    other = build(sc, 4, net=SmallNet(hidden=5)).set_checkpoint(str(tmp_path),
                                                                  SeveralIteration(2))
    with pytest.raises(CheckpointError, match=r"belongs to a different model: it has "
                                              r"\['fc1.weight', \[8, 6\]\] where this model has "
                                              r"\['fc1.weight', \[5, 6\]\]"):
        other.optimize()


def test_checkpoint_of_another_batch_size_is_refused(sc, tmp_path):
    build(sc, 2).set_checkpoint(str(tmp_path), SeveralIteration(2)).optimize()
    opt = build(sc, 4)
    opt.batch_size = 10
    opt.set_checkpoint(str(tmp_path), SeveralIteration(2))
    with pytest.raises(CheckpointError, match=r"written by a run with batch_size=20, but this "
                                              r"run has batch_size=10"):
        opt.optimize()


def test_the_shared_hadoop_filesystem_is_not_reconfigured(sc, tmp_path):
    from sparkdl.storage.hadoop_files import write_bytes

    write_bytes(sc, str(tmp_path), b"sparkdl", "private.bin")
    assert (tmp_path / "private.bin").read_bytes() == b"sparkdl"
    assert not (tmp_path / ".private.bin.crc").exists()      # sparkdl's own files: no .crc
    jvm = sc._jvm
    path = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "theirs.bin"))
    fs = path.getFileSystem(sc._jsc.hadoopConfiguration())   # the JVM's shared instance
    out = fs.create(path, True)
    out.write(bytearray(b"x"))
    out.close()
    assert (tmp_path / ".theirs.bin.crc").exists()           # still writes checksums
