"""Gradient clipping, triggers that see training (loss, validation metrics, early stopping) and
their argument checks (issue: real models, acceptance 4 to 6)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models import JobCounter, SmallNet, make_rdd, max_abs_diff
from sparkdl import BatchPlan, DistriOptimizer, InvalidArgumentError, Loss, Top1Accuracy
from sparkdl.triggers import (EarlyStopping, EveryEpoch, MaxEpoch, MaxIteration, MaxScore, MinLoss,
                              SeveralIteration, TrainingState, TriggerAnd, TriggerOr)

SIZES = [40, 25, 35]
BATCH = 20
SEED = 3


def data(n, seed, noise=0.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(6, 3)) + noise * rng.normal(size=(n, 3)), 1)
    return x, y.astype(np.int64)


def reference_steps(model, x, y, make_optimizer, plan, iterations, clip=None, after_step=None):
    """Plain single-process PyTorch on the engine's union batches, with optional clipping and a
    callback after every step."""
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model)
    for t in range(iterations):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x[idx])),
                                          torch.from_numpy(y[idx])).backward()
        if clip is not None:
            clip(model.parameters())
        optimizer.step()
        if after_step is not None and after_step(t + 1, model):
            break
    return model


def engine(sc, model, x, y, make_optimizer, end, **kwargs):
    net = copy.deepcopy(model)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          make_optimizer(net), batch_size=BATCH, end_trigger=end, seed=SEED,
                          progress_bar=False, **kwargs)
    return net, opt


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.5)


@pytest.mark.parametrize("kind", ["norm", "value"])
def test_clipping_equals_torch_clip_functions(sc, kind):
    x, y = data(100, seed=1)
    torch.manual_seed(0)
    model = SmallNet()
    net, opt = engine(sc, model, x, y, sgd, MaxIteration(10))
    if kind == "norm":
        opt.set_gradient_clipping(0.05, norm_type=2.0)
        clip = lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.05, 2.0)   # noqa: E731
    else:
        opt.set_constant_gradient_clipping(-0.002, 0.002)
        clip = lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.002)      # noqa: E731
    opt.optimize()
    plan = BatchPlan(SIZES, BATCH, SEED)
    clipped = reference_steps(model, x, y, sgd, plan, 10, clip=clip)
    unclipped = reference_steps(model, x, y, sgd, plan, 10)
    assert max_abs_diff(net, clipped) <= 1e-5
    assert max_abs_diff(clipped, unclipped) > 1e-2          # clipping really changed the result


def test_early_stopping_stops_where_single_process_validation_says(sc):
    x, y = data(100, seed=2, noise=3.0)                      # noisy labels: overfits quickly
    xv, yv = data(60, seed=3, noise=3.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.02)       # noqa: E731
    stop = EarlyStopping("Loss", patience=3, mode="min")
    net, opt = engine(sc, model, x, y, adam, MaxIteration(60) | stop)
    opt.set_validation(make_rdd(sc, list(zip(xv, yv)), [30, 30]), SeveralIteration(1), [Loss()])
    opt.optimize()

    # The same rule on single-process validation losses.
    losses, snapshots = [], {}

    def validate(t, m):
        with torch.no_grad():
            losses.append(float(torch.nn.functional.cross_entropy(
                m(torch.from_numpy(xv)), torch.from_numpy(yv))))
        snapshots[t] = copy.deepcopy(m)
        best = int(np.argmin(losses))
        return len(losses) - 1 - best >= 3

    reference_steps(model, x, y, adam, BatchPlan(SIZES, BATCH, SEED), 60, after_step=validate)
    best_iteration = int(np.argmin(losses)) + 1
    assert len(losses) < 60                                  # the rule did stop early
    assert len(opt.summary.iterations) == len(losses)
    assert stop.best_iteration == best_iteration
    assert [v.metrics["Loss"] for v in opt.summary.validations] == pytest.approx(losses,
                                                                                 abs=1e-5)
    assert max_abs_diff(net, snapshots[best_iteration]) <= 1e-5      # restore_best


def test_min_loss_and_max_score_end_training(sc):
    x, y = data(100, seed=4)
    torch.manual_seed(0)
    net, opt = engine(sc, SmallNet(), x, y, sgd, MaxEpoch(30) | MinLoss(0.5))
    opt.optimize()
    losses = [r.loss for r in opt.summary.iterations]
    assert losses[-1] < 0.5 and all(v >= 0.5 for v in losses[:-1])
    net, opt = engine(sc, SmallNet(), x, y, sgd, MaxEpoch(30) | MaxScore("Top1Accuracy", 0.8))
    opt.set_validation(make_rdd(sc, list(zip(x, y)), [50, 50]), SeveralIteration(2),
                       [Top1Accuracy(threshold=0.0)])
    opt.optimize()
    scores = [v.metrics["Top1Accuracy"] for v in opt.summary.validations]
    assert scores[-1] > 0.8 and all(s <= 0.8 for s in scores[:-1])
    assert opt.summary.iterations[-1].iteration == opt.summary.validations[-1].iteration


def test_trigger_algebra():
    def state(iteration, loss=1.0, metrics=None, validated=False):
        return TrainingState(iteration, 0, False, loss, metrics or {}, validated)

    both = MaxIteration(3) & MinLoss(0.5)
    either = MaxIteration(3) | MinLoss(0.5)
    assert isinstance(both, TriggerAnd) and isinstance(either, TriggerOr)
    assert not both(state(3, 0.7)) and both(state(3, 0.4)) and not both(state(2, 0.4))
    assert either(state(3, 0.7)) and either(state(1, 0.4)) and not either(state(2, 0.6))
    assert (MaxScore("acc", 0.9) | MinLoss(0.1)).metric_names() == {"acc"}
    stop = EarlyStopping("acc", patience=2, mode="max")
    combined = MaxIteration(100) | stop
    values = [0.5, 0.6, 0.55, 0.6, 0.58]           # 0.6 is not better than 0.6
    fired = [combined(state(t + 1, metrics={"acc": v}, validated=True))
             for t, v in enumerate(values)]
    assert fired == [False, False, False, True, True] and stop.best_iteration == 2
    assert stop(state(6, metrics={"acc": 0.1})) is True       # stays stopped


def _bad(sc, change):
    x, y = data(40, seed=5)
    rdd = make_rdd(sc, list(zip(x, y)), [20, 20])
    net = SmallNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    before = copy.deepcopy(net.state_dict()), copy.deepcopy(optimizer.state_dict())
    opt = None
    with JobCounter(sc) as jobs:
        try:
            opt = change(net, rdd, optimizer)
        finally:
            assert all(torch.equal(v, net.state_dict()[k]) for k, v in before[0].items())
            assert optimizer.state_dict() == before[1]
            assert jobs.count == 0      # no Spark job ran
    return opt


def _engine(net, rdd, optimizer, end=None):
    return DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(), optimizer, batch_size=10,
                           end_trigger=end or MaxIteration(2))


@pytest.mark.parametrize("change,match", [
    (lambda n, r, o: _engine(n, r, o).set_gradient_clipping(0),
     r"'max_norm' argument of DistriOptimizer\.set_gradient_clipping must be a finite number > 0"
     r"\. Got 0 instead"),
    (lambda n, r, o: _engine(n, r, o).set_gradient_clipping(-1.0), r"'max_norm' .* Got -1\.0"),
    (lambda n, r, o: _engine(n, r, o).set_gradient_clipping(float("nan")), r"'max_norm'"),
    (lambda n, r, o: _engine(n, r, o).set_gradient_clipping(1.0, norm_type=0),
     r"'norm_type' argument .* must be a number > 0 or float\('inf'\)"),
    (lambda n, r, o: _engine(n, r, o).set_constant_gradient_clipping(0.5, -0.5),
     r"'max_value' argument .* must be greater than min_value \(0\.5\)\. Got -0\.5"),
    (lambda n, r, o: EarlyStopping("Loss", patience=0),
     r"'patience' argument of EarlyStopping must be a positive int\. Got 0"),
    (lambda n, r, o: EarlyStopping("Loss", patience=2, mode="median"),
     r"'mode' argument of EarlyStopping must be 'min' or 'max'\. Got 'median'"),
    (lambda n, r, o: MinLoss(float("inf")), r"'value' argument of MinLoss must be a finite"),
    (lambda n, r, o: MaxIteration(3) & 5, r"'triggers' argument of TriggerAnd"),
    (lambda n, r, o: _engine(n, r, o, MaxIteration(9) | EarlyStopping("Loss", 2)).optimize(),
     r"The end_trigger .* reads the validation metric 'Loss', which is never computed"),
    (lambda n, r, o: _engine(n, r, o, MaxScore("Top1Accuracy", 0.9)).set_validation(
        r, SeveralIteration(1), [Loss()]).optimize(),
     r"reads the validation metric 'Top1Accuracy', which set_validation does not compute \(it "
     r"computes \['Loss'\]\)"),
])
def test_bad_values_are_refused_before_any_spark_job(sc, change, match):
    with pytest.raises(InvalidArgumentError, match=match):
        _bad(sc, change)


def test_early_stopping_in_local_rounds_restores_the_best_rounds_weights(sc):
    """In local rounds (``local_steps=5``: a round is an epoch) the end trigger is asked
    about every iteration of a round; the best validation's weights are still the ones kept:
    the final weights are bitwise those of a fit that stops at the best validation."""
    x, y = data(100, seed=2, noise=3.0)                      # noisy labels: overfits quickly
    xv, yv = data(60, seed=3, noise=3.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.02)       # noqa: E731

    def fit(end):
        net, opt = engine(sc, model, x, y, adam, end, local_steps=5)
        opt.set_validation(make_rdd(sc, list(zip(xv, yv)), [30, 30]), EveryEpoch(), [Loss()])
        opt.optimize()
        return net, opt

    stop = EarlyStopping("Loss", patience=2, mode="min", restore_best=True)
    stopped, opt = fit(MaxEpoch(40) | stop)
    losses = [v.metrics["Loss"] for v in opt.summary.validations]
    best = int(np.argmin(losses))
    assert len(losses) == best + 1 + 2                       # stopped by the rule, not MaxEpoch
    assert stop.best_iteration == opt.summary.validations[best].iteration
    assert stop.best_iteration < opt.summary.iterations[-1].iteration
    at_best, _ = fit(MaxIteration(stop.best_iteration))
    assert all(torch.equal(a, b) for a, b in zip(stopped.state_dict().values(),
                                                 at_best.state_dict().values()))
