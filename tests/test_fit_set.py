"""Several fits trained together in one pass (sparkdl.engine.fit_set): every fit's weights are
bitwise those of the same fit trained alone, one job per iteration for the whole set, the
training data held once."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

from models import (BatchNormNet, DropoutNet, JobCounter, classification_data, make_rdd,
                    max_abs_diff, reference_train)
from sparkdl import DistriOptimizer, FitSet, Loss, NonFiniteError
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.runners import LocalPartitions
from sparkdl.transport.allreduce import sum_in_order
from sparkdl.transport.codecs import ExactCodec
from sparkdl.triggers import EarlyStopping, EveryEpoch, MaxEpoch

SIZES = [40, 3, 0, 57]       # a tiny partition (no rows in some batches) and an empty one


def same_bytes(a: nn.Module, b: nn.Module) -> bool:
    """Bitwise: the same bytes, so -0.0 and 0.0 differ (torch.equal would call them equal)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].dtype == sb[k].dtype and sa[k].numpy().tobytes() == sb[k].numpy().tobytes()
        for k in sa)


def local_data(n: int = 100, seed: int = 0) -> tuple[LocalPartitions, np.ndarray, np.ndarray]:
    x, y = classification_data(n, seed=seed)
    records = list(zip(x, y))
    bounds = np.concatenate([[0], np.cumsum(SIZES)])
    return (LocalPartitions([records[a:b] for a, b in zip(bounds[:-1], bounds[1:])]), x, y)


def grid_fit(data, setting: dict, seed: int = 0) -> DistriOptimizer:
    """One fit of the grid: a model built from ``setting["model"]`` with torch seeded, so every
    call gives the same initial weights."""
    torch.manual_seed(setting.get("init", 0))
    model = setting.get("model", DropoutNet)()
    lr, wd = setting.get("lr", 0.1), setting.get("wd", 0.0)
    if setting.get("optimizer") == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
        scheduler = None
    return DistriOptimizer(model, data, nn.CrossEntropyLoss(), optimizer,
                           batch_size=setting.get("batch", 16),
                           end_trigger=MaxEpoch(setting.get("epochs", 2)), seed=seed,
                           lr_scheduler=scheduler, progress_bar=False,
                           allreduce=setting.get("allreduce", "auto"),
                           compression=setting.get("compression"))


GRID = ([{"lr": lr, "wd": wd} for lr in (0.1, 0.02) for wd in (0.0, 1e-3)]
        + [{"lr": 0.01, "optimizer": "adam", "batch": 23, "epochs": 3},
           {"model": BatchNormNet, "lr": 0.05, "batch": 100, "epochs": 3}])


def test_sum_in_order_skips_absent_ranges_exactly():
    """A pass's vector holds zeros where a fit had no rows on a partition; those are skipped,
    so each range is bitwise the sum of the partitions that had values there (-0.0 stays)."""
    codec = ExactCodec(np.dtype("float32"))
    a = np.array([-0.0, 1.5, 2.0, -0.0], dtype=np.float32)
    b = np.array([-0.0, 0.0, 1e-8, 0.0], dtype=np.float32)      # holds nothing in [2, 4)
    c = np.array([-0.0, 3.0, 1.0, -0.0], dtype=np.float32)
    parts = [(0, codec.encode(a, 0)), (1, codec.encode(b, 0)), (2, codec.encode(c, 0))]
    total = sum_in_order(parts, codec, 0, 4, {1: ((2, 4),)})
    expected = np.concatenate([a[:2] + b[:2] + c[:2], a[2:] + c[2:]])
    assert total.tobytes() == expected.tobytes()
    assert np.signbit(total[3])                # -0.0 + -0.0, not -0.0 + 0.0 + -0.0
    # a block [1, 3) of the same vectors: the range is clipped to it
    block = sum_in_order([(p, codec.encode(v[1:3], 1)) for p, v in zip(range(3), (a, b, c))],
                         codec, 1, 2, {1: ((2, 4),)})
    assert block.tobytes() == expected[1:3].tobytes()


def test_a_pass_gives_every_fit_bitwise_its_own_weights():
    """Four settings of lr x weight decay, an Adam fit with a scheduler, another batch size and
    more epochs, and a BatchNorm model, trained together in process: each is bitwise the fit
    alone; the pass runs the iterations of its longest fit, one job each."""
    data, x, y = local_data()
    alone = [grid_fit(data, s) for s in GRID]
    for fit in alone:
        fit.optimize()
    together = [grid_fit(data, s) for s in GRID]
    fit_set = FitSet(together)
    models = fit_set.run()
    assert models == [f.model for f in together]
    assert fit_set.passes == [list(range(len(GRID)))]
    for k, (one, fit) in enumerate(zip(alone, together)):
        assert fit.iteration == one.iteration > 0, k
        assert same_bytes(fit.model, one.model), k
        assert [r.loss for r in fit.summary.iterations] == [r.loss for r in one.summary.iterations]
    assert fit_set.jobs == max(f.iteration for f in together)
    assert fit_set.loads == 1


def test_fits_without_randomness_equal_single_process_pytorch():
    """A pass of two dropout-free fits with other batch sizes: each within float rounding of
    plain PyTorch on the same union batches."""
    data, x, y = local_data()

    def linear() -> nn.Module:
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))

    settings = [(0.2, 16, 2), (0.05, 25, 3)]
    fits = []
    for lr, batch, epochs in settings:
        model = linear()
        fits.append(DistriOptimizer(model, data, nn.CrossEntropyLoss(),
                                    torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                    batch_size=batch, end_trigger=MaxEpoch(epochs), seed=5,
                                    progress_bar=False))
    FitSet(fits).run()
    for (lr, batch, epochs), fit in zip(settings, fits):
        plan = BatchPlan(SIZES, batch, 5)
        reference = reference_train(
            linear(), x, y, nn.CrossEntropyLoss(),
            lambda m, lr=lr: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9), plan,
            plan.iterations_per_epoch * epochs)
        assert max_abs_diff(fit.model, reference) <= 1e-5


def test_a_fit_that_stops_early_or_fails_leaves_the_pass_and_the_others_go_on(caplog):
    """EarlyStopping ends one fit after its validations stop improving, a learning rate of
    1e6 makes another fail on a non-finite loss; the rest of the pass is bitwise the fits
    alone, and the failure is raised once the pass ended, kept in ``errors``."""
    data, _, _ = local_data()
    val, _, _ = local_data(60, seed=1)

    def fit(lr: float, early: bool) -> DistriOptimizer:
        opt = grid_fit(data, {"lr": lr, "epochs": 6})
        if early:
            opt.end_trigger = MaxEpoch(6) | EarlyStopping("Loss", patience=1)
            opt.set_validation(val, EveryEpoch(), [Loss()])
        return opt

    settings = [(0.5, True), (1e6, False), (0.05, False)]
    alone = []
    for lr, early in settings:
        opt = fit(lr, early)
        try:
            opt.optimize()
        except NonFiniteError:
            opt = None
        alone.append(opt)
    assert alone[1] is None
    together = [fit(lr, early) for lr, early in settings]
    fit_set = FitSet(together)
    with caplog.at_level(logging.INFO, logger="sparkdl"), pytest.raises(NonFiniteError):
        fit_set.run()
    assert list(fit_set.errors) == [1]
    assert together[0].iteration < together[2].iteration      # it stopped early
    for k in (0, 2):
        assert same_bytes(together[k].model, alone[k].model), k
        assert together[k].iteration == alone[k].iteration
    assert "fit 1 of the pass failed and leaves it: NonFiniteError" in caplog.text
    assert "fits [0] leave the pass after their iteration" in caplog.text


def test_fits_that_cannot_share_a_pass_train_in_passes_of_their_own(caplog):
    """Another data object is another pass; a fit with compression shares the pass of the
    exact fits and is bitwise the same fit alone."""
    data, _, _ = local_data()
    other, _, _ = local_data()
    settings = [{"lr": 0.1}, {"lr": 0.05}, {"lr": 0.02, "compression": "bf16"}]
    fits = [grid_fit(data, settings[0]), grid_fit(other, {"lr": 0.1}),
            grid_fit(data, settings[1]), grid_fit(data, settings[2])]
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        fit_set = FitSet(fits)
        fit_set.run()
    assert fit_set.passes == [[0, 2, 3], [1]]
    assert "4 fits train in 2 passes" in caplog.text
    alone = grid_fit(data, settings[2])
    alone.optimize()
    assert same_bytes(alone.model, fits[3].model)
    exact = grid_fit(data, {"lr": 0.02})
    exact.optimize()
    assert not same_bytes(exact.model, fits[3].model)     # bf16 changed the sums


def test_a_pass_codec_sends_each_fits_part_as_its_own_codec_does():
    """A pass's vector of a bf16 fit, an exact one and another bf16 fit (other exact
    buffer ranges): any block of it decodes to exactly what each fit's own codec gives for
    that part."""
    from sparkdl.transport.codecs import Bf16Codec, make_pass_codec

    f32 = np.dtype("float32")
    own = [Bf16Codec(f32, exact_from=5), ExactCodec(f32), Bf16Codec(f32, exact_from=3)]
    sizes = [8, 4, 6]
    vector = np.random.default_rng(0).normal(size=sum(sizes)).astype(np.float32) / 3
    expected = np.concatenate([c.decode(c.encode(v, 0), 0, len(v)) for c, v in zip(
        own, np.split(vector, np.cumsum(sizes)[:-1]))])
    assert not np.array_equal(expected, vector)          # something was rounded
    codec = make_pass_codec(own, sizes, f32)
    assert codec.rounded == ((0, 5), (12, 15))
    for lo, hi in [(0, 18), (3, 13), (6, 12), (13, 18), (4, 5)]:
        payload = codec.encode(vector[lo:hi], lo)
        assert len(payload) == 4 * (hi - lo) - 2 * sum(
            max(0, min(b, hi) - max(a, lo)) for a, b in codec.rounded)
        assert codec.decode(payload, lo, hi - lo).tobytes() == expected[lo:hi].tobytes()
    assert type(make_pass_codec([ExactCodec(f32)] * 2, [3, 4], f32)) is ExactCodec


def test_bad_fit_sets_are_refused_before_any_work():
    data, _, _ = local_data()
    one = grid_fit(data, {})
    with pytest.raises(Exception, match="at least one"):
        FitSet([])
    with pytest.raises(Exception, match="the same DistriOptimizer twice"):
        FitSet([one, one])
    with pytest.raises(Exception, match="fit 1 is int"):
        FitSet([one, 3])
    twin = DistriOptimizer(one.model, data, nn.CrossEntropyLoss(),
                           torch.optim.SGD(one.model.parameters(), lr=0.1), batch_size=8)
    with pytest.raises(Exception, match="the same model object"):
        FitSet([one, twin])


def test_a_grid_on_spark_runs_one_job_per_iteration_and_holds_the_data_once(sc):
    """On local[2]: a grid of lr x weight decay plus a setting with another batch size and more
    epochs and one whose gradients travel in bf16 (its BatchNorm statistics exact), as a pass on
    each AllReduce path. Each fit is bitwise the fit alone; the pass's jobs
    are those of its longest fit plus a constant (not one set per setting), and the training
    data's shards are built once."""
    x, y = classification_data(100)
    rdd = make_rdd(sc, list(zip(x, y)), SIZES)
    grid = ([{"lr": lr, "wd": wd} for lr in (0.1, 0.02) for wd in (0.0, 1e-3)]
            + [{"lr": 0.05, "batch": 30, "epochs": 3},
               {"lr": 0.02, "compression": "bf16", "model": BatchNormNet, "batch": 100,
                "epochs": 3}])
    alone_jobs = []
    alone = []
    for setting in grid:
        fit = grid_fit(rdd, setting)
        with JobCounter(sc) as jobs:
            fit.optimize()
        alone_jobs.append(jobs.count)
        alone.append(fit)
    for allreduce in ("shuffle", "driver"):   # every path sums bitwise alike
        together = [grid_fit(rdd, dict(s, allreduce=allreduce)) for s in grid]
        fit_set = FitSet(together)
        with JobCounter(sc) as jobs:
            fit_set.run()
        for k, (one, fit) in enumerate(zip(alone, together)):
            assert same_bytes(fit.model, one.model), (allreduce, k)
        assert fit_set.jobs == max(f.iteration for f in together)
        assert fit_set.loads == 1
        assert jobs.count <= 1.5 * max(alone_jobs) + 3, (jobs.count, alone_jobs)
        assert sum(alone_jobs) > 3 * jobs.count, (jobs.count, alone_jobs)


class FakeBroadcast:
    """A broadcast stand-in that counts what was made and destroyed (pickles by value)."""

    made: list["FakeBroadcast"] = []

    def __init__(self, value):
        self.value, self.destroyed = value, False
        FakeBroadcast.made.append(self)

    def destroy(self, blocking=False):
        self.destroyed = True

    def __reduce__(self):
        return (FakeBroadcast, (self.value,))


def test_a_bundle_sends_the_fits_values_as_one_broadcast_destroyed_with_its_last_handle():
    import pickle

    from sparkdl.transport.broadcast_bundle import BroadcastBundle

    made = FakeBroadcast.made
    made.clear()
    bundle = BroadcastBundle(FakeBroadcast)
    a, b = bundle(np.arange(3)), bundle({"rows": 2})
    assert bundle.flush() == 2 and len(made) == 1
    assert np.array_equal(a.value, np.arange(3)) and b.value == {"rows": 2}
    shipped = pickle.loads(pickle.dumps(b))       # what a task reads
    assert shipped.value == {"rows": 2}
    a.destroy()
    assert not made[0].destroyed
    b.destroy()
    assert made[0].destroyed
    assert bundle.flush() == 0 and len(made) == 2    # the unpickled copy; nothing new
