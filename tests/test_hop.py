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
    from sparkdl.engine.hop_order import visiting_order

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
    from sparkdl.engine.hop_order import visiting_order

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
