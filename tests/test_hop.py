"""Model hopping (``FitSet(..., strategy="hop")``): every model equals single-process PyTorch
trained on the same shards in its visiting order, partition by partition, batch by batch; two
runs are bitwise equal; a model's result does not depend on the models hopping beside it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models import SmallNet, bitwise_equal, classification_data, hop_reference, make_rdd

SIZES = [30, 25, 35]
X, Y = classification_data(sum(SIZES), seed=1)
BOUNDS = np.cumsum([0] + SIZES)

# (batch size, seed, optimizer, scheduler stepping per iteration)
SETTINGS = [
    (8, 3, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), None),
    (16, 4, lambda p: torch.optim.Adam(p, lr=0.01), None),
    (7, 5, lambda p: torch.optim.Adagrad(p, lr=0.05), None),
    (32, 6, lambda p: torch.optim.RMSprop(p, lr=0.005), None),
    (10, 7, lambda p: torch.optim.SGD(p, lr=0.2),
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)),
]
EPOCHS = 2


def make_model(k: int) -> tuple[SmallNet, torch.optim.Optimizer, object]:
    torch.manual_seed(11 + k)
    net = SmallNet()
    optimizer = SETTINGS[k][2](net.parameters())
    scheduler = SETTINGS[k][3](optimizer) if SETTINGS[k][3] else None
    return net, optimizer, scheduler


def make_fits(data, epochs: int = EPOCHS, models=range(len(SETTINGS))):
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxEpoch

    fits = []
    for k in models:
        net, optimizer, scheduler = make_model(k)
        fits.append(DistriOptimizer(
            net, data, torch.nn.CrossEntropyLoss(), optimizer, batch_size=SETTINGS[k][0],
            end_trigger=MaxEpoch(epochs), seed=SETTINGS[k][1], lr_scheduler=scheduler,
            lr_scheduler_step="iteration", progress_bar=False))
    return fits


def reference(k: int, position: int, epochs: int = EPOCHS, hop_seed: int = 0) -> SmallNet:
    """Single-process torch in the model's visiting order (models.hop_reference)."""
    net, optimizer, scheduler = make_model(k)
    partitions = [(X[a:b], Y[a:b]) for a, b in zip(BOUNDS[:-1], BOUNDS[1:])]
    return hop_reference(net, optimizer, partitions, torch.nn.CrossEntropyLoss(),
                         SETTINGS[k][0], SETTINGS[k][1], epochs, position, hop_seed, scheduler)


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.state_dict().values(),
                                                        b.state_dict().values()))


def test_visiting_orders_cover_every_partition_and_keep_models_apart():
    from sparkdl.engine.strategies.hop.order import visiting_order

    for epoch in range(3):
        orders = [visiting_order(0, epoch, m, 4) for m in range(6)]
        for order in orders:
            assert sorted(order) == [0, 1, 2, 3]
        for s in range(4):      # positions that differ modulo 4 are on different partitions
            assert len({orders[m][s] for m in range(4)}) == 4
            assert orders[4][s] == orders[0][s] and orders[5][s] == orders[1][s]
    assert visiting_order(0, 0, 0, 8) != visiting_order(0, 1, 0, 8)     # reshuffled per epoch
    assert visiting_order(0, 0, 0, 8) != visiting_order(1, 0, 0, 8)     # seeded


@pytest.fixture(scope="module")
def hop_run(sc):
    from sparkdl import FitSet

    rdd = make_rdd(sc, list(zip(X, Y)), SIZES)
    fits = make_fits(rdd)
    fit_set = FitSet(fits, strategy="hop")
    fit_set.run()
    return rdd, fits, fit_set


def test_each_hopped_model_is_single_process_torch_in_its_visiting_order(hop_run):
    _, fits, fit_set = hop_run
    # local[2]: every shard on the one executor, so a model's sub-epochs run on in the
    # same task (fused) until the driver must act
    assert fit_set.jobs == 1       # no validation or checkpoints: the whole run in one
    for k, fit in enumerate(fits):
        assert fit.iteration == EPOCHS * len(SIZES)
        difference = max_difference(fit.model, reference(k, position=k))
        assert difference <= 1e-6, (k, difference)
        assert max_difference(fit.model, make_model(k)[0]) > 1e-2      # it trained
    from sparkdl.engine.strategies.hop.order import visiting_order

    records = fits[1].summary.iterations         # one record per sub-epoch: its partition
    assert [r.records for r in records[:3]] == [SIZES[p] for p in visiting_order(0, 0, 1, 3)]


def test_two_hop_runs_are_bitwise_equal_and_alone_equals_together(hop_run, sc):
    from sparkdl import FitSet

    rdd, fits, _ = hop_run
    again = make_fits(rdd)
    FitSet(again, strategy="hop").run()
    for k, (a, b) in enumerate(zip(fits, again)):
        assert bitwise_equal(a.model, b.model), k
    alone = make_fits(rdd, models=[3])
    FitSet(alone, strategy="hop", hop_positions=[3]).run()      # fit 3 alone, in its order
    assert bitwise_equal(alone[0].model, fits[3].model)


def test_sub_epochs_one_job_each_give_bitwise_the_fused_models(hop_run):
    """An end trigger whose timing sparkdl cannot tell (MinLoss reads every sub-epoch's loss)
    stops the fusing: one job per sub-epoch, the same bits."""
    from sparkdl import FitSet
    from sparkdl.triggers import MaxEpoch, MinLoss

    rdd, fits, _ = hop_run
    unfused = make_fits(rdd)
    for fit in unfused:
        fit.end_trigger = MaxEpoch(EPOCHS) | MinLoss(1e-9)
    fit_set = FitSet(unfused, strategy="hop")
    fit_set.run()
    assert fit_set.jobs == EPOCHS * len(SIZES)          # one job per sub-epoch for all five
    for k, (a, b) in enumerate(zip(fits, unfused)):
        assert bitwise_equal(a.model, b.model), k


def test_hop_in_process_is_bitwise_the_spark_run(hop_run):
    from sparkdl import FitSet
    from sparkdl.runners import LocalPartitions

    _, fits, _ = hop_run
    local = LocalPartitions([list(zip(X[a:b], Y[a:b])) for a, b in zip(BOUNDS[:-1],
                                                                       BOUNDS[1:])])
    in_process = make_fits(local)
    FitSet(in_process, strategy="hop").run()
    for k, (a, b) in enumerate(zip(fits, in_process)):
        assert bitwise_equal(a.model, b.model), k


class ShrinkingNet(SmallNet):
    """SmallNet whose output is scaled by a non-persistent buffer that every training forward
    shrinks: state_dict() leaves it out, yet it changes the result."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.scale.mul_(0.99)
        return super().forward(x) * self.scale


def test_epoch_schedulers_empty_partitions_and_unsaved_buffers_fused_or_not():
    """Per-epoch StepLR, an empty partition and a non-persistent buffer the forward changes:
    each model is single-process torch in its visiting order, and one job per sub-epoch (an
    epoch that ends on the empty partition: no task, the driver steps the scheduler) gives
    bitwise the fused models."""
    from sparkdl import DistriOptimizer, FitSet
    from sparkdl.engine.strategies.hop.order import visiting_order
    from sparkdl.runners import LocalPartitions
    from sparkdl.triggers import MaxEpoch, MinLoss

    sizes, epochs, positions = [30, 0, 25, 35], 3, [0, 1, 2]
    bounds = np.cumsum([0] + sizes)
    parts = [(X[a:b], Y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    # some model's epoch ends on the empty partition (what the unfused run must get right)
    assert any(visiting_order(0, e, m, 4)[-1] == 1 for e in range(epochs) for m in positions)

    def model(m: int):
        torch.manual_seed(20 + m)
        net = ShrinkingNet()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.5)
        return net, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)

    def fits(fused: bool):
        out = []
        for m in positions:
            net, optimizer, scheduler = model(m)
            trigger = MaxEpoch(epochs) if fused else MaxEpoch(epochs) | MinLoss(1e-9)
            out.append(DistriOptimizer(
                net, LocalPartitions([list(zip(x, y)) for x, y in parts]),
                torch.nn.CrossEntropyLoss(), optimizer, batch_size=8, end_trigger=trigger,
                seed=9, lr_scheduler=scheduler, progress_bar=False))
        return out

    fused, unfused = fits(True), fits(False)
    FitSet(fused, strategy="hop").run()
    unfused_set = FitSet(unfused, strategy="hop")
    unfused_set.run()
    assert unfused_set.jobs > epochs          # one job per sub-epoch with samples
    for m, (a, b) in enumerate(zip(fused, unfused)):
        assert bitwise_equal(a.model, b.model), m
        assert torch.equal(a.model.scale, b.model.scale), m
        assert a.optimizer.param_groups[0]["lr"] == b.optimizer.param_groups[0]["lr"] == \
            0.2 * 0.5 ** epochs
        net, optimizer, scheduler = model(m)
        hop_reference(net, optimizer, parts, torch.nn.CrossEntropyLoss(), 8, 9, epochs, m,
                      scheduler=scheduler, scheduler_per_epoch=True)
        assert max_difference(a.model, net) <= 1e-6, m
        assert torch.equal(a.model.scale, net.scale), m     # the buffer came back each job


class PoisonedNet(SmallNet):
    """SmallNet whose output is NaN for a batch holding a sample with a first feature above
    50: the data decides where a model goes non-finite, however its sub-epochs are fused."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * torch.nan if bool((x[:, 0] > 50).any()) else out


def test_a_non_finite_sub_epoch_keeps_the_good_ones_before_it_fused_or_not():
    """A fused run that meets a NaN in its third sub-epoch keeps the weights of the two
    before it, bitwise those of one job per sub-epoch, and says which sub-epoch failed."""
    from sparkdl import DistriOptimizer, FitSet
    from sparkdl.engine.strategies.hop.order import visiting_order
    from sparkdl.errors import NonFiniteError
    from sparkdl.runners import LocalPartitions
    from sparkdl.triggers import MaxEpoch, MinLoss

    x = X.copy()
    order = visiting_order(0, 0, 0, 3)
    x[BOUNDS[order[2]], 0] = 100.0       # a sample of the model's third partition in epoch 0
    data = LocalPartitions([list(zip(x[a:b], Y[a:b])) for a, b in zip(BOUNDS[:-1], BOUNDS[1:])])

    def run(fused: bool):
        torch.manual_seed(31)
        net = PoisonedNet()
        fit = DistriOptimizer(
            net, data, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
            batch_size=8, seed=2, progress_bar=False,
            end_trigger=MaxEpoch(2) if fused else MaxEpoch(2) | MinLoss(1e-9))
        fit_set = FitSet([fit], strategy="hop")
        with pytest.raises(NonFiniteError, match="stopped at sub-epoch 3"):
            fit_set.run()
        return fit, fit_set

    fused, fused_set = run(True)
    unfused, unfused_set = run(False)
    assert fused_set.jobs == 3 and unfused_set.jobs == 3    # 2 good + the failing one
    assert fused.iteration == unfused.iteration == 2
    assert bitwise_equal(fused.model, unfused.model)
    torch.manual_seed(31)
    start = PoisonedNet()
    assert max_difference(fused.model, start) > 1e-3         # the two sub-epochs kept


def test_hop_refuses_what_it_cannot_do_before_any_job():
    from sparkdl import DistriOptimizer, FitSet
    from sparkdl.errors import InvalidArgumentError
    from sparkdl.runners import LocalPartitions

    data = LocalPartitions([list(zip(X[:30], Y[:30]))])
    net = SmallNet()
    fit = DistriOptimizer(net, data, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                          precision="16-mixed", progress_bar=False)
    with pytest.raises(InvalidArgumentError, match="16-mixed"):
        FitSet([fit], strategy="hop").run()
    with pytest.raises(InvalidArgumentError, match="strategy"):
        FitSet([fit], strategy="hopping")
    with pytest.raises(InvalidArgumentError, match="hop_positions"):
        FitSet([fit], strategy="hop", hop_positions=[0, 1])


def test_a_hop_checkpoint_is_never_resumed_by_a_data_parallel_fit(sc, tmp_path):
    import fit_set_job
    from sparkdl import FitSet
    from sparkdl.errors import CheckpointError
    from sparkdl.triggers import MaxIteration

    path = str(tmp_path / "ckpt")
    hop = fit_set_job.fits(sc)[:1]
    hop[0].end_trigger = MaxIteration(2)
    hop[0].set_checkpoint(path, MaxIteration(1))
    FitSet(hop, strategy="hop").run()
    data_parallel = fit_set_job.fits(sc)[:1]
    data_parallel[0].end_trigger = MaxIteration(4)
    data_parallel[0].set_checkpoint(path, MaxIteration(1))
    with pytest.raises(CheckpointError, match="model hopping"):
        data_parallel[0].optimize()


def test_hop_on_a_runner_that_cannot_hop_is_refused_before_any_job():
    """Spark Connect's DataFrame runner has no hop jobs: a clear error, nothing trained."""
    from sparkdl import FitSet, SharedRunner
    from sparkdl.errors import InvalidArgumentError
    from sparkdl.runners import LocalPartitions

    class NoHops:               # a runner without ``hop`` (as ConnectDataFrameRunner)
        def close(self) -> None:
            pass

    fits = make_fits(LocalPartitions([list(zip(X[:30], Y[:30]))]), models=[0])
    before = {k: v.clone() for k, v in fits[0].model.state_dict().items()}
    shared = SharedRunner()
    shared.runner = NoHops()
    with pytest.raises(InvalidArgumentError, match="'hop' strategy needs a classic"):
        FitSet(fits, shared=shared, strategy="hop").run()
    assert all(torch.equal(before[k], v) for k, v in fits[0].model.state_dict().items())
