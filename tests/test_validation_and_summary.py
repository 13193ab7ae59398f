"""Validation metrics, the per-iteration summary and its log lines, and the buffer rule."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch

from models import BatchNormNet, TwoInputNet, classification_data, make_rdd, max_abs_diff
from sparkdl import MAE, DistriOptimizer, Loss, Top1Accuracy
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.triggers import EveryEpoch, MaxEpoch, MaxIteration, SeveralIteration
from models import SmallNet


def test_validation_metrics_match_a_direct_computation(sc):
    x, y = classification_data(90, seed=2)
    vx, vy = classification_data(50, seed=3)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [50, 40]),
                          torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.3),
                          batch_size=30, end_trigger=MaxEpoch(2))
    opt.set_validation(make_rdd(sc, list(zip(vx, vy)), [20, 0, 30]), EveryEpoch(),
                       [Top1Accuracy(), Loss()], batch_size=7)
    trained = opt.optimize()
    assert [v.iteration for v in opt.summary.validations] == [3, 6]
    last = opt.summary.validations[-1].metrics
    with torch.no_grad():
        out = trained(torch.from_numpy(vx))
    accuracy = float((out.argmax(1).numpy() == vy).mean())
    loss = float(torch.nn.CrossEntropyLoss()(out, torch.from_numpy(vy)))
    assert last["Top1Accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert last["Loss"] == pytest.approx(loss, rel=1e-5)


def test_mae_for_regression_every_few_iterations(sc):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 1))).astype(np.float32)
    net = torch.nn.Linear(6, 1)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [32, 32]), torch.nn.MSELoss(),
                          torch.optim.SGD(net.parameters(), lr=0.05), batch_size=16,
                          end_trigger=MaxIteration(6))
    opt.set_validation(make_rdd(sc, list(zip(x, y)), [64]), SeveralIteration(3), [MAE(), Loss()])
    trained = opt.optimize()
    assert [v.iteration for v in opt.summary.validations] == [3, 6]
    with torch.no_grad():
        out = trained(torch.from_numpy(x))
    mae = float((out - torch.from_numpy(y)).abs().mean())
    assert opt.summary.validations[-1].metrics["MAE"] == pytest.approx(mae, rel=1e-5)
    assert opt.summary.validations[-1].metrics["Loss"] == pytest.approx(
        float(((out - torch.from_numpy(y)) ** 2).mean()), rel=1e-5)


@pytest.mark.parametrize("allreduce", ["driver", "shuffle"])
def test_summary_time_split_and_one_log_line_per_iteration(sc, caplog, allreduce):
    x, y = classification_data(60)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [30, 30]),
                          torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                          batch_size=20, end_trigger=MaxIteration(4), allreduce=allreduce)
    with caplog.at_level(logging.DEBUG, logger="sparkdl"):   # each iteration's line: DEBUG
        opt.optimize()
    lines = [r.getMessage() for r in caplog.records if " iteration " in r.getMessage()
             and "records" in r.getMessage()]
    assert len(lines) == 4
    assert lines[0].startswith("epoch 1 iteration 1 (1/3): records 20, loss ")
    assert "samples/s" in lines[0]
    frame = opt.summary.to_pandas()
    assert list(frame["iteration"]) == [1, 2, 3, 4]
    for rec in opt.summary.iterations:
        spans = (rec.compute_s, rec.reduce_s, rec.update_s, rec.broadcast_s, rec.launch_s,
                 rec.exchange_s, rec.collect_s)
        assert rec.compute_s > 0 and rec.wall_s > 0 and rec.launch_s > 0
        assert all(0 <= span <= rec.wall_s for span in spans)
        assert rec.other_s == pytest.approx(max(0.0, rec.wall_s - sum(spans)), abs=1e-9)
        # only the shuffle has a map-to-reduce exchange; both collect results at the driver
        assert (rec.exchange_s > 0) == (allreduce == "shuffle") and rec.collect_s > 0
        assert rec.samples_per_s == pytest.approx(rec.records / rec.wall_s)
    assert frame["loss"].iloc[0] == pytest.approx(opt.summary.iterations[0].loss)


def test_multi_input_model_with_array_labels(sc):
    rng = np.random.default_rng(4)
    records = [((rng.normal(size=3).astype(np.float32), rng.normal(size=2).astype(np.float32)),
                rng.normal(size=2).astype(np.float32)) for _ in range(40)]
    torch.manual_seed(0)
    net = TwoInputNet()
    start = copy.deepcopy(net)
    opt = DistriOptimizer(net, make_rdd(sc, records, [25, 15]), torch.nn.MSELoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=40,
                          end_trigger=MaxIteration(2))
    trained = opt.optimize()
    a = torch.from_numpy(np.stack([r[0][0] for r in records]))
    b = torch.from_numpy(np.stack([r[0][1] for r in records]))
    t = torch.from_numpy(np.stack([r[1] for r in records]))
    sgd = torch.optim.SGD(start.parameters(), lr=0.1)
    for _ in range(2):  # full batch: the order of samples does not matter
        sgd.zero_grad()
        torch.nn.MSELoss()(start(a, b), t).backward()
        sgd.step()
    assert max_abs_diff(trained, start) <= 1e-5


def test_batchnorm_buffers_are_the_sample_weighted_average_of_the_tasks(sc):
    x, y = classification_data(50, seed=5)
    sizes = [30, 20]
    torch.manual_seed(1)
    net = BatchNormNet()
    start = copy.deepcopy(net)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.0), batch_size=25, seed=2,
                          end_trigger=MaxIteration(1))
    trained = opt.optimize()
    plan = BatchPlan(sizes, 25, 2)
    expected_mean = torch.zeros(5)
    expected_var = torch.zeros(5)
    for i in range(2):
        replica = copy.deepcopy(start).train()
        idx = plan.offsets[i] + plan.local_indices(0, 0, i)
        replica(torch.from_numpy(x[idx]))
        weight = len(idx) / 25
        expected_mean += weight * replica.bn.running_mean
        expected_var += weight * replica.bn.running_var
    assert torch.allclose(trained.bn.running_mean, expected_mean, atol=1e-6)
    assert torch.allclose(trained.bn.running_var, expected_var, atol=1e-6)
    assert int(trained.bn.num_batches_tracked) == 1
    assert not torch.allclose(trained.bn.running_mean, start.bn.running_mean)


@pytest.mark.parametrize("criterion, threshold, warned", [
    (torch.nn.MSELoss(), None, True),           # probabilities read as logits: all class 1
    (torch.nn.MSELoss(), 0.5, False),           # the user chose the threshold
    (torch.nn.BCELoss(), None, False),          # BCELoss: the threshold is already 0.5
])
def test_a_sigmoid_ended_model_under_another_loss_warns_about_the_threshold(
        caplog, criterion, threshold, warned):
    """Top1Accuracy's threshold is 0.0 (a logit) unless the loss is BCELoss; a model ending in
    Sigmoid trained with another loss gets a warning naming the layer and the loss (issue 35).
    In process: no Spark."""
    from sparkdl.runners import LocalPartitions

    rng = np.random.default_rng(4)
    x = rng.normal(size=(24, 6)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    records = list(zip(x, y))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 1), torch.nn.Sigmoid())
    opt = DistriOptimizer(net, LocalPartitions([records[:12], records[12:]]), criterion,
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=12,
                          end_trigger=MaxIteration(2), progress_bar=False)
    opt.set_validation(LocalPartitions([records]), SeveralIteration(1),
                       [Top1Accuracy(threshold=threshold)])
    with caplog.at_level(logging.WARNING, logger="sparkdl"):
        opt.optimize()
    lines = [r.getMessage() for r in caplog.records if "Top1Accuracy" in r.getMessage()]
    if warned:
        assert lines == [
            "Top1Accuracy: the model's last layer is Sigmoid (its one output is a probability) "
            "and it is trained with MSELoss, so the class-1 threshold is 0.0 (the output taken "
            "as a logit) and every sample counts as class 1. Pass Top1Accuracy(threshold=0.5), "
            "or drop the final Sigmoid and train with torch.nn.BCEWithLogitsLoss."]
        # what it warns about: every sample counted as class 1
        assert opt.summary.validations[-1].metrics["Top1Accuracy"] == float(y.sum()) / len(y)
    else:
        assert lines == []
