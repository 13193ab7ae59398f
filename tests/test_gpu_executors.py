"""GPU executors and mixed precision, tested without a GPU (issue: GPU executors, acceptance 1
and 2): the device decision, GPU scheduling on a local-cluster with fake GPUs, the replica cache
keyed by device, bf16 autocast against single-process torch, and the float16 loss scale against
GradScaler's rules."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from models import (JobCounter, SmallNet, bitwise_equal, classification_data, make_rdd,
                    max_abs_diff)
from sparkdl import BatchPlan, DistriOptimizer, InvalidArgumentError
from sparkdl.engine.fit.optim.loss_scaling import LossScaler
from sparkdl.executor.devices import DeviceError, choose_device
from sparkdl.triggers import MaxIteration
from zoo_models import partitioned_reference_train

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("requested,addresses,cuda,count,visible,device,physical", [
    ("cpu", ["0"], True, 2, None, "cpu", None),
    ("auto", [], True, 2, None, "cpu", None),
    ("auto", ["1"], False, 0, None, "cpu", None),
    ("auto", ["0"], True, 4, None, "cuda:0", "0"),
    ("cuda", ["3"], True, 4, None, "cuda:3", "3"),
    ("auto", ["1"], True, 2, "4,5", "cuda:1", "5"),        # addresses index CUDA_VISIBLE_DEVICES
    ("cuda", ["0", "1"], True, 2, "6,7", "cuda:0", "6"),    # two GPUs per task: the first
])
def test_the_device_rule(requested, addresses, cuda, count, visible, device, physical):
    choice = choose_device(requested, addresses, cuda, count, visible)
    assert (choice.device, choice.physical) == (device, physical)


def test_fractional_amounts_share_one_gpu():
    # spark.task.resource.gpu.amount=0.5: two concurrent tasks get the same address.
    a = choose_device("auto", ["1"], True, 2, None)
    b = choose_device("auto", ["1"], True, 2, None)
    assert a.device == b.device == "cuda:1"


@pytest.mark.parametrize("requested,addresses,cuda,count,visible,match", [
    ("cuda", [], True, 2, None, r"assigned this task no GPU: set "
                                r"spark\.executor\.resource\.gpu\.amount and "
                                r"spark\.task\.resource\.gpu\.amount"),
    ("cuda", ["0"], False, 0, None, r"CUDA is not available"),
    ("auto", ["3"], True, 2, "4,5", r"address 3 but this process sees 2 GPU\(s\) "
                                    r"\(CUDA_VISIBLE_DEVICES=4,5\)"),
])
def test_device_errors_name_the_cause(requested, addresses, cuda, count, visible, match):
    with pytest.raises(DeviceError, match=match):
        choose_device(requested, addresses, cuda, count, visible)


def test_the_replica_cache_is_keyed_by_device():
    from sparkdl.executor.replicas import ReplicaSpec, drop_replica, get_replica

    class Spec:            # like the broadcast: every read unpickles a fresh copy
        @property
        def value(self):
            return ReplicaSpec(torch.nn.Linear(3, 2), torch.nn.MSELoss(), "mean")

    try:
        on_cpu = get_replica("device-test", Spec(), "cpu")
        on_meta = get_replica("device-test", Spec(), "meta")      # a second device, no GPU
        assert on_cpu is not on_meta
        assert on_cpu.model.weight.device.type == "cpu"
        assert on_meta.model.weight.device.type == "meta"
        assert get_replica("device-test", Spec(), "cpu") is on_cpu
    finally:
        drop_replica("device-test")


def _engine(sc, **kwargs):
    x, y = classification_data(40)
    net = SmallNet()
    return DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [20, 20]),
                           torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                           batch_size=10, end_trigger=MaxIteration(2), progress_bar=False,
                           **kwargs)


def test_cuda_without_gpu_scheduling_fails_before_any_job(sc):
    with JobCounter(sc) as jobs, pytest.raises(
            InvalidArgumentError, match=r"device='cuda' needs GPUs scheduled to the "
                                        r"tasks.*spark\.executor\.resource\.gpu\.amount"):
        _engine(sc, device="cuda").optimize()
    assert jobs.count == 0
    with pytest.raises(InvalidArgumentError, match=r"'device' argument of DistriOptimizer must "
                                                   r"be 'auto', 'cpu' or 'cuda'"):
        _engine(sc, device="gpu")
    with pytest.raises(InvalidArgumentError, match=r"'precision' argument of DistriOptimizer "
                                                   r"must be '32', 'bf16-mixed' or '16-mixed'"):
        _engine(sc, precision="fp16")


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["global", "profile"])
def test_tasks_see_their_gpu_addresses_on_a_local_cluster(sc, tmp_path, mode):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    markers = tmp_path / "markers"
    markers.mkdir()
    out_json, out_pt = tmp_path / "out.json", tmp_path / "weights.pt"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "gpu_cluster_job.py"), mode,
                           str(script), str(markers), str(out_json), str(out_pt)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(out_json.read_text())
    gradient_tasks = seen["markers"]
    # Every gradient task was given one of the fake GPUs; both executors took part.
    assert gradient_tasks and all(not m.endswith("-none") for m in gradient_tasks)
    assert {m.rsplit("-", 1)[1] for m in gradient_tasks} <= {"0", "1"}
    assert len({m.split("-")[1] for m in gradient_tasks}) == 2
    if mode == "global":
        assert all(len(a) == 1 for a in seen["etl"])          # every stage holds a GPU
        # a task-side DeviceError reaches the driver as DeviceError, after one attempt each
        cuda = seen["cuda"]
        assert (cuda["type"], cuda["module"]) == ("DeviceError", "sparkdl.executor.devices")
        assert "CUDA is not available in its Python worker" in cuda["message"]
        assert cuda["failed_tasks"] == 0 and int(cuda["max_failures"]) > 1
    else:
        assert all(a == [] for a in seen["etl"])              # ETL stages hold none
        assert any("task resource profile" in m for m in seen["log"])
        # local rounds: every round task was given one of the fake GPUs, on both executors,
        # and (no CUDA here) the weights are those of the same rounds on local[2]
        rounds_tasks = seen["rounds_markers"]
        assert rounds_tasks and all(not m.endswith("-none") for m in rounds_tasks)
        assert len({m.split("-")[1] for m in rounds_tasks}) == 2
        x, y = classification_data(100, seed=1)
        torch.manual_seed(7)
        net = SmallNet()
        DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [40, 25, 35]),
                        torch.nn.CrossEntropyLoss(),
                        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                        batch_size=16, end_trigger=MaxIteration(6), seed=5, progress_bar=False,
                        local_steps=3, outer_optimizer="nesterov").optimize()
        rounds = SmallNet()
        rounds.load_state_dict(torch.load(str(out_pt) + ".rounds", weights_only=True))
        assert bitwise_equal(rounds, net)
    # No CUDA here: "auto" falls back to the CPU and says why; the weights are the CPU run's.
    assert any("CUDA is not available" in m for m in seen["log"])
    x, y = classification_data(100, seed=1)
    torch.manual_seed(7)
    net = SmallNet()
    DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [40, 25, 35]),
                    torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                    batch_size=16, end_trigger=MaxIteration(4), seed=5,
                    progress_bar=False).optimize()
    trained = SmallNet()
    trained.load_state_dict(torch.load(out_pt, weights_only=True))
    assert bitwise_equal(trained, net)


def autocast_reference(model, x, y, make_optimizer, plan, iterations, dtype, scaler=None):
    """Single-process training under ``torch.autocast("cpu", dtype)`` on the plan's union
    batches, with ``scaler`` (a GradScaler) if given; returns the model and, per step, the loss
    scale used and whether the step was skipped."""
    reference = copy.deepcopy(model)
    optimizer = make_optimizer(reference)
    steps = []
    for t in range(iterations):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x[idx])),
                                                     torch.from_numpy(y[idx]))
        if scaler is None:
            loss.backward()
            optimizer.step()
            continue
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        steps.append((scale, scaler.get_scale() < scale))
    return reference, steps


def assert_within_rounding(trained, reference, start, fraction, slack):
    """Every parameter of ``trained`` within ``fraction`` of how far ``reference`` moved it from
    ``start`` (plus ``slack``)."""
    for (name, a), b, s in zip(trained.named_parameters(), reference.parameters(),
                               start.parameters()):
        moved = (b - s).abs().max().item()
        assert (a - b).abs().max().item() <= fraction * moved + slack, name


def test_bf16_mixed_on_cpu_equals_single_process_autocast(sc):
    x, y = classification_data(120, seed=3)
    sizes, batch, seed, iterations = [50, 30, 40], 24, 5, 8
    torch.manual_seed(0)
    model = SmallNet(hidden=32)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.2)        # noqa: E731
    net = copy.deepcopy(model)
    DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), torch.nn.CrossEntropyLoss(),
                    sgd(net), batch_size=batch, end_trigger=MaxIteration(iterations), seed=seed,
                    precision="bf16-mixed", progress_bar=False).optimize()
    plan = BatchPlan(sizes, batch, seed)
    # 1. The same arithmetic as the tasks (each share under autocast, gradients summed in fp32):
    #    equal up to float32 summation.
    per_task = partitioned_reference_train(model, (x,), y, torch.nn.CrossEntropyLoss(), sgd, plan,
                                           iterations, seed, autocast=torch.bfloat16)
    assert max_abs_diff(net, per_task) <= 1e-6
    # 2. Plain single-process autocast on the union batch: the gradient of a bf16 matmul is
    #    rounded to bf16 (8 significant bits) once per task instead of once per batch, so each
    #    step's gradient may differ by a few bf16 roundings, 2**-7 of its size at most. The weights
    #    may therefore differ by 2**-7 of how far they moved, and no more.
    union, _ = autocast_reference(model, x, y, sgd, plan, iterations, torch.bfloat16)
    assert_within_rounding(net, union, model, 2 ** -7, 1e-7)
    assert not bitwise_equal(net, model)


def test_the_loss_scale_follows_gradscaler_with_an_injected_inf():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
    ours = LossScaler(init_scale=2.0 ** 10, growth_interval=3)
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    injected = [False, False, False, False, True, False, True, True, False, False, False, False]
    for step, inf in enumerate(injected):
        optimizer.zero_grad()
        scaler.scale((param * 0.5).sum()).backward()
        if inf:
            with torch.no_grad():
                param.grad[1] = float("inf")            # an overflow in one task's gradient
        summed = param.grad.detach().numpy().copy()     # what the driver receives
        before = param.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        found_inf = not np.isfinite(summed).all()
        ours.update(found_inf)
        assert torch.equal(param, before) == found_inf, step        # skipped exactly then
        assert ours.scale == scaler.get_scale(), step
    assert ours.skipped == 3


def test_16_mixed_equals_autocast_with_gradscaler_through_injected_overflows(sc):
    from zoo_models import OverflowNet

    x, y = classification_data(120, seed=4)
    x[[5, 70, 101], 0] = 4.0                                 # the rows that overflow
    sizes, batch, seed, iterations = [50, 30, 40], 24, 5, 20
    torch.manual_seed(0)
    model = OverflowNet()
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)         # noqa: E731
    net = copy.deepcopy(model)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), torch.nn.CrossEntropyLoss(),
                          sgd(net), batch_size=batch, end_trigger=MaxIteration(iterations),
                          seed=seed, precision="16-mixed", progress_bar=False)
    opt.optimize()
    reference, steps = autocast_reference(model, x, y, sgd, BatchPlan(sizes, batch, seed),
                                          iterations, torch.float16, torch.amp.GradScaler("cpu"))
    scales, skipped = zip(*steps)
    records = opt.summary.iterations
    assert 2 <= sum(skipped) < iterations                     # overflows happened, and passed
    assert [r.step_skipped for r in records] == list(skipped)
    assert [r.loss_scale for r in records] == list(scales)
    # Each task's float16 matmul gradients are rounded once per task instead of once per batch
    # (2**-11 relative each): the weights may differ by a few such roundings of how far they
    # moved.
    assert_within_rounding(net, reference, model, 2 ** -8, 1e-6)
