"""Local rounds (``local_steps``, ``outer_optimizer``, ``sync_warmup``): each run equals its own
single-process definition (tests/rounds_reference.py, plain torch worker after worker), H = 1
with plain SGD and plain averaging is synchronous SGD, and the weights are bitwise the clean
run's through a failed task, a killed executor and a killed driver.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import cluster_job
from models import (SmallNet, TablesNet, bitwise_equal, classification_data, id_pairs_data,
                    make_rdd, max_abs_diff, reference_train,
                    tables_optimizer)
from rounds_reference import rounds_reference
from sparkdl import DistriOptimizer, FitSet, Loss
from sparkdl.errors import InvalidArgumentError
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import MaxEpoch, MaxIteration, SeveralIteration

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [90, 0, 37, 73]          # uneven, with an empty partition
BATCH, SEED = 16, 5


class ConvBN(nn.Module):
    """A CNN with BatchNorm (running statistics averaged over the workers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1, bias=False)   # BatchNorm follows
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.conv(x.unsqueeze(1)))).flatten(1))


class EmbeddingNet(nn.Module):
    """Ids into an embedding table (its deltas travel as rows), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(50, 4)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).flatten(1))


class SequenceNet(nn.Module):
    """An LSTM over the 6 features read as a sequence of 6 steps."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, 5, batch_first=True)
        self.out = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(x.unsqueeze(-1))[0][:, -1])


def _data(kind: str, n: int = sum(SIZES)) -> tuple[np.ndarray, np.ndarray]:
    x, y = classification_data(n, d=6, seed=1)
    if kind == "tables":
        return id_pairs_data(n, seed=1)
    if kind == "embedding":
        ids = (np.abs(x[:, :2]) * 17).astype(np.int64) % 50
        return ids, ((ids[:, 0] + ids[:, 1]) % 3).astype(np.int64)
    return x, y


MODELS = {
    "mlp-sgd-momentum": (SmallNet, "mlp",
                         lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)),
    "cnn-batchnorm-adam": (ConvBN, "mlp", lambda m: torch.optim.Adam(m.parameters(), lr=0.01)),
    "embedding-adagrad": (EmbeddingNet, "embedding",
                          lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1)),
    "lstm-adam": (SequenceNet, "mlp", lambda m: torch.optim.Adam(m.parameters(), lr=0.02)),
    # sparse=True tables under SparseAdam and the head under Adam (an OptimizerSequence)
    "sparse-tables": (TablesNet, "tables", tables_optimizer),
}


def _partitions(kind: str, sizes=SIZES):
    x, y = _data(kind, sum(sizes))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _local(parts) -> LocalPartitions:
    return LocalPartitions([list(zip(x, y)) for x, y in parts])


def _fit(model, data, make_optimizer, iterations, **rounds):
    opt = DistriOptimizer(model, data, nn.CrossEntropyLoss(), make_optimizer(model),
                          batch_size=BATCH, seed=SEED, end_trigger=MaxIteration(iterations),
                          progress_bar=False, **rounds)
    opt.optimize()
    return opt


CASES = [(name, h, outer, warmup) for name in MODELS if name != "sparse-tables"
         for h, outer, warmup in [(1, "average", 0), (4, "nesterov", 0), (16, "average", 3)]] + [
    ("sparse-tables", 4, "nesterov", 2),
    ("mlp-sgd-momentum", 4, "average", 5), ("mlp-sgd-momentum", 16, "nesterov", 0),
    ("mlp-sgd-momentum", 1, "nesterov", 2)]


@pytest.mark.parametrize("name,local_steps,outer,warmup", CASES)
def test_rounds_equal_their_single_process_definition(name, local_steps, outer, warmup):
    """Worker after worker in plain torch (tests/rounds_reference.py), 3 epochs (39
    iterations: rounds cut at the epochs' ends) on uneven partitions with an empty one."""
    make_model, kind, make_optimizer = MODELS[name]
    parts = _partitions(kind)
    torch.manual_seed(0)
    net = make_model()
    iterations = 3 * -(-sum(SIZES) // BATCH)
    expected = rounds_reference(net, parts, nn.CrossEntropyLoss(), make_optimizer, BATCH, SEED,
                                iterations, local_steps, outer, warmup)
    opt = _fit(net, _local(parts), make_optimizer, iterations, local_steps=local_steps,
               outer_optimizer=outer, sync_warmup=warmup)
    assert len(opt.summary.iterations) == iterations
    assert max_abs_diff(net, expected) < 1e-5
    for a, b in zip(net.state_dict().values(), expected.state_dict().values()):
        if not a.is_floating_point():          # BatchNorm's num_batches_tracked
            assert torch.equal(a, b)


def test_rounds_with_schedulers_equal_their_definition():
    """A per-iteration and a per-epoch scheduler, each stepped on every worker's own copy."""
    parts = _partitions("mlp")
    for step, make in (("iteration", lambda o: torch.optim.lr_scheduler.LambdaLR(
            o, lambda t: 0.97 ** t)), ("epoch", lambda o: torch.optim.lr_scheduler.StepLR(
                o, 1, 0.5))):
        torch.manual_seed(0)
        net = SmallNet()
        make_opt = MODELS["mlp-sgd-momentum"][2]
        expected = rounds_reference(net, parts, nn.CrossEntropyLoss(), make_opt, BATCH, SEED, 26,
                                    4, "nesterov", 2, make_scheduler=make, scheduler_step=step)
        optimizer = make_opt(net)
        opt = DistriOptimizer(net, _local(parts), nn.CrossEntropyLoss(), optimizer,
                              batch_size=BATCH, seed=SEED, end_trigger=MaxIteration(26),
                              progress_bar=False, lr_scheduler=make(optimizer),
                              lr_scheduler_step=step, local_steps=4, outer_optimizer="nesterov",
                              sync_warmup=2)
        opt.optimize()
        assert max_abs_diff(net, expected) < 1e-5, step


def test_a_model_kept_between_rounds_gives_a_fresh_models_bits(monkeypatch):
    """Issue 54: a worker keeps the fit's model, optimizer and scheduler from round to round
    when they are torch's own (each round loads every weight and buffer and their whole state):
    the same bits as a model unpickled afresh every round, with BatchNorm buffers, Adam's state
    and a per-iteration scheduler; a user's optimizer class is unpickled afresh."""
    from sparkdl.executor import round_task

    parts = _partitions("mlp", sizes=[90, 37, 73])    # every partition with data
    built: list[int] = []
    real_replica = round_task.Replica

    def counting(*args, **kwargs):
        built.append(1)
        return real_replica(*args, **kwargs)

    monkeypatch.setattr(round_task, "Replica", counting)

    def run(make_opt=lambda m: torch.optim.Adam(m.parameters(), lr=0.01)):
        built.clear()
        torch.manual_seed(0)
        net = ConvBN()
        optimizer = make_opt(net)
        DistriOptimizer(net, _local(parts), nn.CrossEntropyLoss(), optimizer, batch_size=BATCH,
                        seed=SEED, end_trigger=MaxIteration(26), progress_bar=False,
                        lr_scheduler=torch.optim.lr_scheduler.LambdaLR(
                            optimizer, lambda t: 0.97 ** t), lr_scheduler_step="iteration",
                        local_steps=4, outer_optimizer="nesterov").optimize()
        return net, len(built)

    kept, kept_builds = run()
    monkeypatch.setattr(round_task, "restores_fully", lambda bundle: False)
    fresh, fresh_builds = run()
    # 2 epochs of 13 iterations: 8 rounds; kept, only each partition's first round (which starts
    # from the bundle's own optimizer, nothing stored to load) unpickles the bundle
    assert kept_builds == 3 and fresh_builds == 8 * 3
    assert bitwise_equal(kept, fresh)
    monkeypatch.undo()

    class MyAdam(torch.optim.Adam):
        pass

    bundle = round_task.HopBundle(None, MyAdam([nn.Parameter(torch.zeros(1))]))
    assert not round_task.restores_fully(bundle)
    assert round_task.restores_fully(round_task.HopBundle(None, torch.optim.Adam(
        [nn.Parameter(torch.zeros(1))])))


def test_all_finite_is_exact_in_one_pass():
    """The round's check of its weights: a float64 sum decides, values looked at one by one
    only when it is not finite."""
    from sparkdl.executor.round_task import all_finite

    big = torch.full((4,), 3e38)                       # float32: their sum fits float64
    assert all_finite(big) and all_finite(torch.zeros(0))
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert not all_finite(torch.tensor([1.0, bad, 2.0]))
        assert not all_finite(torch.tensor([1.0, bad], dtype=torch.bfloat16))
    assert all_finite(torch.tensor([1.7e308, 1.7e308], dtype=torch.float64))   # sum overflows
    assert not all_finite(torch.tensor([1.7e308, float("nan")], dtype=torch.float64))


def test_the_weighted_delta_is_torchs_subtraction_and_product_bitwise():
    """The round's delta ``weight * (w_start - w)``, written straight into the vector for dense
    parameters: bitwise torch's ``(start - w).mul_(weight)``, tables through their rows."""
    from sparkdl.executor.round_task import weighted_delta
    from sparkdl.transport.flat_layout import ParamLayout

    torch.manual_seed(3)
    net = EmbeddingNet()
    layout = ParamLayout(net)
    start = layout.state_vector(net)
    before = {k: v.clone() for k, v in net.named_parameters()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    weight = 37 / 200
    vector, present = weighted_delta(net, layout, start, weight)
    assert present.tolist() == [1] * len(layout.params)
    for k, slot in enumerate(layout.params):
        p = dict(net.named_parameters())[slot.name]
        expected = (before[slot.name] - p.detach()).mul_(weight)
        if slot.rows:
            assert torch.equal(p.grad.to_dense() if p.grad.is_sparse else p.grad, expected)
        else:
            got = torch.from_numpy(vector[slot.start:slot.stop]).view(slot.shape)
            assert torch.equal(got, expected) and p.grad is None


def test_one_step_rounds_with_plain_sgd_and_averaging_are_synchronous_sgd():
    """H = 1, plain SGD inside, plain averaging: synchronous SGD up to float rounding; the
    default (local_steps=1, no outer optimizer) is synchronous SGD itself."""
    parts = _partitions("mlp")
    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.2)  # noqa: E731
    torch.manual_seed(0)
    net = SmallNet()
    rounds_net, sync_net = SmallNet(), SmallNet()
    rounds_net.load_state_dict(net.state_dict())
    sync_net.load_state_dict(net.state_dict())
    _fit(rounds_net, _local(parts), make_opt, 30, local_steps=1, outer_optimizer="average")
    sync = _fit(sync_net, _local(parts), make_opt, 30)
    assert FitSet([sync]).strategy_of([0]).name == "together"
    assert 0 < max_abs_diff(rounds_net, sync_net) < 1e-6 or bitwise_equal(rounds_net, sync_net)
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    from sparkdl import BatchPlan
    expected = reference_train(net, x, y, nn.CrossEntropyLoss(), make_opt,
                               BatchPlan(SIZES, BATCH, SEED), 30)
    assert max_abs_diff(sync_net, expected) < 1e-6


def test_triggers_that_fall_inside_a_round_fire_at_its_end(tmp_path):
    """Validation every 5 iterations and checkpoints every 3: both act at the ends of the
    rounds in which they fall (rounds of 8, cut at the epochs' ends: 0-8, 8-13, 13-21,
    21-26)."""
    parts = _partitions("mlp")
    torch.manual_seed(0)
    net = SmallNet()
    opt = DistriOptimizer(net, _local(parts), nn.CrossEntropyLoss(),
                          MODELS["mlp-sgd-momentum"][2](net), batch_size=BATCH, seed=SEED,
                          end_trigger=MaxEpoch(2), progress_bar=False, local_steps=8)
    opt.set_validation(_local(parts[:1]), SeveralIteration(5), [Loss()])
    opt.set_checkpoint(str(tmp_path), SeveralIteration(3), keep_last=10)
    opt.optimize()
    assert [v.iteration for v in opt.summary.validations] == [8, 13, 21, 26]
    written = sorted(int(f[11:21]) for f in os.listdir(tmp_path) if f.startswith("checkpoint-"))
    assert written == [8, 13, 21, 26]
    assert [r.iteration for r in opt.summary.iterations] == list(range(1, 27))


def test_the_rounds_settings_are_in_the_resume_key(tmp_path):
    """A synchronous checkpoint is not resumed by a fit in rounds nor the other way round;
    H, the outer optimizer (a callable by its content) and the warm-up each give a fit its own
    subdirectory with by_fit."""
    from sparkdl.errors import CheckpointError

    parts = _partitions("mlp")
    make_opt = MODELS["mlp-sgd-momentum"][2]

    def fit(directory, by_fit=False, **rounds):
        torch.manual_seed(0)
        net = SmallNet()
        opt = DistriOptimizer(net, _local(parts), nn.CrossEntropyLoss(), make_opt(net),
                              batch_size=BATCH, seed=SEED, end_trigger=MaxIteration(8),
                              progress_bar=False, **rounds)
        opt.set_checkpoint(str(directory), SeveralIteration(4), by_fit=by_fit)
        return opt

    fit(tmp_path / "sync").optimize()
    with pytest.raises(CheckpointError, match="belongs to another fit"):
        fit(tmp_path / "sync", local_steps=4).optimize()
    fit(tmp_path / "rounds", local_steps=4).optimize()
    with pytest.raises(CheckpointError, match="trained by local rounds"):
        fit(tmp_path / "rounds").optimize()
    for rounds in ({"local_steps": 4}, {"local_steps": 8}, {"local_steps": 4, "sync_warmup": 2},
                   {"local_steps": 4, "outer_optimizer": "nesterov"},
                   {"local_steps": 4, "outer_optimizer": _outer_sgd_half}):
        fit(tmp_path / "by-fit", True, **rounds).optimize()
    assert len([d for d in os.listdir(tmp_path / "by-fit") if d.startswith("fit-")]) == 5


def test_training_longer_from_a_round_cut_by_the_end_is_refused_before_any_round(tmp_path):
    """MaxIteration(10) with H = 4 ends on a round cut at 10 (rounds 1-4, 5-8, 9-10); a fresh
    MaxIteration(20) fit trains 9-12 there, so going on from iteration 10 could not give its
    bits: it is refused, saying why and what to do. Resumed from the checkpoint at 8 (the
    message's advice), training longer is bitwise the fresh longer fit."""
    from sparkdl.errors import CheckpointError

    parts = _partitions("mlp")
    make_opt = MODELS["mlp-sgd-momentum"][2]

    def fit(iterations, directory=None):
        torch.manual_seed(0)
        net = SmallNet()
        opt = DistriOptimizer(net, _local(parts), nn.CrossEntropyLoss(), make_opt(net),
                              batch_size=BATCH, seed=SEED, end_trigger=MaxIteration(iterations),
                              progress_bar=False, local_steps=4)
        if directory is not None:
            opt.set_checkpoint(str(directory), SeveralIteration(2), keep_last=5)
        opt.optimize()
        return opt

    fresh = fit(20)
    short = fit(10, tmp_path)
    assert [r.iteration for r in short.summary.iterations] == list(range(1, 11))
    cut = os.path.join(str(tmp_path), "checkpoint-0000000010.pt")
    assert os.path.exists(cut)
    with pytest.raises(CheckpointError) as err:
        fit(20, tmp_path)
    message = str(err.value)
    assert (f"The checkpoint {cut} is at iteration 10, inside one of this fit's local rounds "
            "(iterations 9-12, local_steps=4)") in message
    assert f"Remove {cut} to resume from the checkpoint at iteration 8" in message
    assert "here at iteration 8 or 12" in message and "Nothing has trained yet." in message
    os.remove(cut)
    longer = fit(20, tmp_path)
    assert longer.summary.iterations[0].iteration == 1 and len(longer.summary.iterations) == 20
    assert bitwise_equal(longer.model, fresh.model)


def test_rounds_shorter_than_local_steps_are_said_once(caplog):
    """local_steps=1000 over epochs of 13 iterations: rounds of 13 (a round never crosses an
    epoch's end), said once; an end trigger before that says so; rounds of local_steps say
    nothing."""
    import logging

    parts = _partitions("mlp")
    per_epoch = -(-sum(SIZES) // BATCH)
    make_opt = MODELS["mlp-sgd-momentum"][2]

    def warnings(iterations, local_steps):
        caplog.clear()
        torch.manual_seed(0)
        with caplog.at_level(logging.WARNING, logger="sparkdl"):
            opt = _fit(SmallNet(), _local(parts), make_opt, iterations, local_steps=local_steps)
        return opt, [r.getMessage() for r in caplog.records if "local_steps=" in r.getMessage()]

    opt, said = warnings(2 * per_epoch, 1000)
    assert said == [f"local_steps=1000, but this fit's rounds take at most {per_epoch} "
                    "iterations: a round never crosses an epoch's end, and an epoch has "
                    f"{per_epoch} iterations"]
    assert len(opt.summary.iterations) == 2 * per_epoch
    assert warnings(3, 1000)[1] == ["local_steps=1000, but this fit's rounds take at most 3 "
                                    "iterations: the end trigger ends the fit at iteration 3"]
    assert warnings(per_epoch, 4)[1] == []


def test_rounds_are_refused_where_they_cannot_run():
    from sparkdl.engine.strategies.base import check_capability
    from sparkdl.engine.strategies.rounds.strategy import RoundsStrategy
    from sparkdl.runners.connect_dataframe import ConnectDataFrameRunner

    runner = ConnectDataFrameRunner.__new__(ConnectDataFrameRunner)
    with pytest.raises(InvalidArgumentError, match="Spark Connect runs synchronous SGD only"):
        check_capability(RoundsStrategy(), runner)
    net = SmallNet()
    data = _local(_partitions("mlp"))
    with pytest.raises(InvalidArgumentError, match="outer_optimizer must be"):
        DistriOptimizer(net, data, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                        batch_size=8, outer_optimizer="adam")
    with pytest.raises(InvalidArgumentError, match="sync_warmup=3 has no effect"):
        DistriOptimizer(net, data, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                        batch_size=8, sync_warmup=3)
    with pytest.raises(InvalidArgumentError, match="local_steps"):
        DistriOptimizer(net, data, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                        batch_size=8, local_steps=0)
    # an optimizer whose step needs a closure, refused before the data is even read
    lbfgs = DistriOptimizer(net, data, nn.CrossEntropyLoss(), torch.optim.LBFGS(net.parameters()),
                            batch_size=8, local_steps=2, end_trigger=MaxIteration(2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(InvalidArgumentError, match=r"LBFGS\.step needs a closure .* local "
                                                   r"rounds do not run such an optimizer .* "
                                                   r"train it synchronously \(local_steps=1"):
        lbfgs.optimize()
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


# ---------------------------------------------------------------------------------- on Spark
def test_rounds_on_spark_equal_their_definition_and_repeat_bitwise(sc):
    """local[2]: a pass of two fits with the same H (one job per round for both), each equal to
    its definition; the same seed again gives the same bits."""
    parts = _partitions("mlp")
    x, y = _data("mlp")
    rdd = make_rdd(sc, list(zip(x, y)), SIZES)
    make_opt = MODELS["mlp-sgd-momentum"][2]
    torch.manual_seed(0)
    init = SmallNet()
    runs = []
    for _ in range(2):
        nets = [SmallNet(), SmallNet()]
        for n in nets:
            n.load_state_dict(init.state_dict())
        fits = [DistriOptimizer(n, rdd, nn.CrossEntropyLoss(), make_opt(n), batch_size=BATCH,
                                seed=SEED, end_trigger=MaxEpoch(2), progress_bar=False,
                                local_steps=4, outer_optimizer=outer)
                for n, outer in zip(nets, ["nesterov", "average"])]
        fit_set = FitSet(fits)
        fit_set.run()
        assert fit_set.passes == [[0, 1]]
        assert fit_set.jobs == 8            # 2 epochs of 13 iterations: rounds 4+4+4+1
        runs.append(nets)
    for n, outer in zip(runs[0], ["nesterov", "average"]):
        expected = rounds_reference(init, parts, nn.CrossEntropyLoss(), make_opt, BATCH, SEED,
                                    26, 4, outer)
        assert max_abs_diff(n, expected) < 1e-5
    assert all(bitwise_equal(a, b) for a, b in zip(*runs))


@pytest.fixture(scope="module")
def clean_rounds(sc):
    trained, _ = cluster_job.train(sc, local_steps=4, outer="nesterov")
    return trained


def _job(tmp_path, master, *extra):
    out = tmp_path / "weights.pt"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cluster_job.py"), master,
                           str(out), "--local-steps", "4", "--outer", "nesterov", *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    model = SmallNet()
    model.load_state_dict(torch.load(out, weights_only=True))
    return model, proc


def test_a_task_failed_mid_round_gives_the_clean_runs_bits(clean_rounds, tmp_path):
    """With I/O encryption on too (the shards in the workers' memory, pyspark's encrypted
    broadcasts carrying the rounds' weights and states)."""
    marker = tmp_path / "fault"
    model, proc = _job(tmp_path, "local[2,4]", "--fault", "task", "--marker", str(marker),
                       "--encrypt-io")
    assert "stay in the Python workers' memory" in proc.stderr
    assert marker.exists(), "no task failed"
    assert "were retried by Spark" in proc.stderr
    assert bitwise_equal(model, clean_rounds)


@pytest.mark.cluster
def test_an_executor_killed_mid_round_gives_the_clean_runs_bits(clean_rounds, tmp_path):
    """Killed in the second round (a worker's fifth loss: each partition's first round unpickles
    the bundle afresh, the second goes on with a kept one): the partitions' optimizer states
    that were on it are rebuilt from the first round's durable copies by replay."""
    marker = tmp_path / "fault"
    model, proc = _job(tmp_path, "local-cluster[2,1,1024]", "--fault", "executor", "--marker",
                       str(marker), "--fault-at-call", "5")
    assert marker.exists(), "no executor was killed"
    assert "executors=2" in proc.stdout
    assert "rebuilding them from their durable copy and 1 round(s) since" in proc.stderr
    assert bitwise_equal(model, clean_rounds)


@pytest.mark.cluster
def test_a_killed_driver_resumes_its_rounds_bitwise(sc, tmp_path):
    """Checkpoints every 2 iterations fire at the rounds' ends (4, 7, 11, 12: rounds of 4 cut
    at the 7-iteration epochs' ends); a driver SIGKILLed after the first resumes every
    partition's optimizer state and the outer one."""
    _, resumed = cluster_job.resume_after_a_killed_driver(tmp_path, 12, "--local-steps", "4",
                                                          "--outer", "nesterov")
    uninterrupted, _ = cluster_job.train(sc, iterations=12, local_steps=4, outer="nesterov")
    assert bitwise_equal(resumed, uninterrupted)


# ---------------------------------------------------------------------------------- estimators
def test_the_classifier_in_local_rounds_fits_saves_loads_transforms_and_cross_validates(
        spark, tmp_path):
    """NNClassifier(localSteps=16, outerOptimizer="nesterov") fits (one job per round), saves
    and loads (the estimator and its model), transforms; a CrossValidator over localSteps
    chooses between H = 1 and 16; a callable outer optimizer survives save and load."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from df_helpers import mlp4, vector_df
    from sparkdl import NNClassifier, NNClassifierModel

    df = vector_df(spark, 160)
    clf = NNClassifier(model=mlp4, criterion=nn.CrossEntropyLoss(), batchSize=16, maxEpoch=2,
                       learningRate=0.05, optimizer="sgd", momentum=0.9, seed=0,
                       progressBar=False, numTrainWorkers=2, localSteps=16,
                       outerOptimizer="nesterov")
    from models import JobCounter

    with JobCounter(spark.sparkContext) as jobs:
        model = clf.fit(df)
    assert model.summary["iterations"].tolist() == [10, 10]     # 2 epochs of 10 iterations
    assert jobs.count < 20         # one job per round (10 iterations each), not per iteration
    clf.write().overwrite().save(str(tmp_path / "est"))
    loaded = NNClassifier.load(str(tmp_path / "est"))
    assert (loaded.getLocalSteps(), loaded.getOuterOptimizer()) == (16, "nesterov")
    assert bitwise_equal(loaded.fit(df).module, model.module)
    model.write().overwrite().save(str(tmp_path / "model"))
    again = NNClassifierModel.load(str(tmp_path / "model"))
    assert [r.prediction for r in again.transform(df).collect()] == \
        [r.prediction for r in model.transform(df).collect()]
    custom = clf.copy({clf.outerOptimizer: _outer_sgd_half})
    custom.write().overwrite().save(str(tmp_path / "custom"))
    assert NNClassifier.load(str(tmp_path / "custom")).getOuterOptimizer()([
        nn.Parameter(torch.zeros(1))]).defaults["lr"] == 0.5
    grid = ParamGridBuilder().addGrid(clf.localSteps, [1, 16]).build()
    cv = CrossValidator(estimator=clf.copy({clf.maxEpoch: 1}), estimatorParamMaps=grid,
                        numFolds=2, parallelism=1,
                        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    cv_model = cv.fit(df)
    assert len(cv_model.avgMetrics) == 2 and all(0.0 <= m <= 1.0 for m in cv_model.avgMetrics)


def _outer_sgd_half(params):
    return torch.optim.SGD(params, lr=0.5)
