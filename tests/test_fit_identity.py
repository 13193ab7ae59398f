"""A fit is what determines its result (issue: identity derived, not listed).

Each pair below differs in one knob that changes the weights (shown by fitting both fresh), and
shares a checkpoint directory: the second fit must never resume the first's checkpoint. With
``by_fit=True`` it gets its own subdirectory and equals its own fresh fit bitwise; in a plain
directory it is refused, naming what differs. Then the signature walk: every argument and setter
of DistriOptimizer and every Param of each estimator is either in the identity (changing it
changes the identity) or in the explicit list of what cannot change the weights.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import SmallNet, bitwise_equal, classification_data
from sparkdl import CheckpointError, DistriOptimizer, Loss, NNClassifier, NNEstimator
from sparkdl.adapters import huggingface_step
from sparkdl import UnidentifiableError
from sparkdl.engine.fit.resume.fit_identity import (NOT_IN_IDENTITY, PARAMS_NOT_IN_IDENTITY,
                                                    SETTER_STATE, fit_identity, params_identity)
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import EarlyStopping, EveryEpoch, MaxEpoch, MaxIteration, SeveralIteration

ITERATIONS = 8


def _partitions(records):
    return LocalPartitions([records[:30], records[30:]])


X, Y = classification_data(54, d=6, seed=7)
DATA = _partitions(list(zip(X, Y)))
REGRESSION = _partitions([(x, np.array([x.sum()], np.float32)) for x in X])
VALIDATION = _partitions(list(zip(*classification_data(40, d=6, seed=8))))
FLIPPED = _partitions([(x, (y + 1) % 3) for x, y in zip(*classification_data(40, d=6, seed=8))])
TOKENS = _partitions([(np.random.default_rng(i).integers(1, 20, 1 + i % 5).astype(np.int64),
                       i % 3) for i in range(54)])


class ScaledCrossEntropy(torch.nn.Module):
    """A custom criterion whose attribute decides the loss."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, output, target):
        return F.cross_entropy(output, target) * self.scale


class BagOfTokens(torch.nn.Module):
    """model(padded ids, lengths): the padding ids count, so padding_value matters."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 5)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, ids, lengths):
        return self.head(self.embedding(ids).mean(1))


class TinyCausalLM(torch.nn.Module):
    """A Hugging Face-shaped causal LM: forward(input_ids, labels) -> {"loss", "logits"}, the
    loss the mean over shifted, non-ignored labels."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 6)
        self.head = torch.nn.Linear(6, 20)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embedding(input_ids))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 20), labels[:, 1:].reshape(-1),
                               ignore_index=-100)
        return {"loss": loss, "logits": logits}


SEQUENCES = _partitions([(row, row) for row in
                         np.random.default_rng(3).integers(1, 20, (54, 6)).astype(np.int64)])


def scaled_step(scale):
    def step(model, inputs, target):
        return F.cross_entropy(model(*inputs), target) * scale
    return step


def _scheduler(rate):
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: rate ** e)


def _scheduler_from_start(rate):
    """Its first epoch already runs at ``rate`` (a one-epoch fit sees the difference)."""
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                               lambda e: rate ** (e + 1))


# knob -> (the two variants); each variant is a dict of build() arguments
PAIRS = {
    "gradient clipping": (dict(clip=0.05), dict(clip=None)),
    "train_transform": (dict(train_transform=lambda f, rng: f * 2.0),
                        dict(train_transform=lambda f, rng: f * 3.0)),
    "padding_value": (dict(model=BagOfTokens, data=TOKENS, sequence_inputs=(0,),
                           padding_value=0.0),
                      dict(model=BagOfTokens, data=TOKENS, sequence_inputs=(0,),
                           padding_value=7.0)),
    "LambdaLR's lambda": (dict(scheduler=_scheduler(0.99)), dict(scheduler=_scheduler(0.01))),
    "a training step's scale": (dict(criterion=None, training_step=scaled_step(1.0)),
                                dict(criterion=None, training_step=scaled_step(100.0))),
    "HuberLoss(delta)": (dict(criterion=torch.nn.HuberLoss(delta=0.1), data=REGRESSION, out=1),
                         dict(criterion=torch.nn.HuberLoss(delta=5.0), data=REGRESSION, out=1)),
    "SmoothL1Loss(beta)": (dict(criterion=torch.nn.SmoothL1Loss(beta=0.1), data=REGRESSION,
                                out=1),
                           dict(criterion=torch.nn.SmoothL1Loss(beta=5.0), data=REGRESSION,
                                out=1)),
    "a custom criterion's attribute": (dict(criterion=ScaledCrossEntropy(1.0)),
                                       dict(criterion=ScaledCrossEntropy(30.0))),
    "huggingface_step(shift_labels)": (
        dict(model=TinyCausalLM, data=SEQUENCES, criterion=None,
             training_step=huggingface_step(("input_ids",), shift_labels=True)),
        dict(model=TinyCausalLM, data=SEQUENCES, criterion=None,
             training_step=huggingface_step(("input_ids",), shift_labels=False))),
    "huggingface_step(ignore_index)": (
        dict(model=TinyCausalLM, data=SEQUENCES, criterion=None,
             training_step=huggingface_step(("input_ids",), ignore_index=-100)),
        dict(model=TinyCausalLM, data=SEQUENCES, criterion=None,
             training_step=huggingface_step(("input_ids",), ignore_index=3))),
    "the validation data (ReduceLROnPlateau follows it)": (
        dict(validation=VALIDATION, plateau=True), dict(validation=FLIPPED, plateau=True)),
}


def build(model=SmallNet, data=DATA, criterion="ce", clip=None, scheduler=None, out=3,
          validation=None, plateau=False, **kwargs):
    torch.manual_seed(5)
    net = model() if model is not SmallNet else SmallNet(classes=out)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.5)
    if plateau:
        scheduler = lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(  # noqa: E731
            o, patience=0, factor=0.05, threshold=0.0)
    opt = DistriOptimizer(net, data,
                          torch.nn.CrossEntropyLoss() if criterion == "ce" else criterion,
                          optimizer, batch_size=9, end_trigger=MaxIteration(ITERATIONS),
                          seed=4, progress_bar=False,
                          lr_scheduler=scheduler(optimizer) if scheduler else None,
                          lr_scheduler_step="iteration", **kwargs)
    if clip is not None:
        opt.set_gradient_clipping(clip)
    if validation is not None:
        opt.set_validation(validation, SeveralIteration(2), [Loss()])
    return opt


@pytest.mark.parametrize("knob", list(PAIRS))
def test_fits_that_differ_in_one_knob_never_share_a_checkpoint(tmp_path, knob):
    first, second = PAIRS[knob]
    fresh_first = build(**first).optimize()
    fresh_second = build(**second).optimize()
    assert not bitwise_equal(fresh_first, fresh_second), f"{knob} does not change the weights"
    shared = str(tmp_path / "by-fit")
    build(**first).set_checkpoint(shared, EveryEpoch(), by_fit=True).optimize()
    resumed = build(**second).set_checkpoint(shared, EveryEpoch(), by_fit=True).optimize()
    assert bitwise_equal(resumed, fresh_second), f"{knob}: the second fit resumed the first's"
    plain = str(tmp_path / "plain")
    build(**first).set_checkpoint(plain, SeveralIteration(ITERATIONS)).optimize()
    with pytest.raises(CheckpointError, match="belongs to another fit"):
        build(**second).set_checkpoint(plain, EveryEpoch()).optimize()


def test_the_same_fit_resumes_and_its_identity_is_stable(tmp_path):
    path = str(tmp_path)
    build(clip=0.05, scheduler=_scheduler(0.9)).set_checkpoint(
        path, SeveralIteration(4), by_fit=True).optimize()
    again = build(clip=0.05, scheduler=_scheduler(0.9))
    again.end_trigger = MaxIteration(ITERATIONS + 4)         # training longer resumes
    again.set_checkpoint(path, SeveralIteration(4), by_fit=True).optimize()
    assert [r.iteration for r in again.summary.iterations] == list(range(1, ITERATIONS + 5))
    assert len(list(tmp_path.iterdir())) == 1
    a, b = fit_identity(build(clip=0.05)), fit_identity(build(clip=0.05))
    assert a == b


def test_an_object_that_cannot_be_hashed_is_refused_unless_the_fit_is_named(tmp_path):
    lock = threading.Lock()               # the scheduler stays on the driver: never pickled

    def locked(optimizer):
        def rate(epoch):
            with lock:
                return 0.9 ** epoch
        return torch.optim.lr_scheduler.LambdaLR(optimizer, rate)

    opt = build(scheduler=locked).set_checkpoint(str(tmp_path / "refused"), EveryEpoch())
    with pytest.raises(UnidentifiableError, match=r"lr_scheduler\.lr_lambdas\[0\] closure "
                                                  r"value 'lock' \(_thread.lock\).*"
                                                  r"set_fit_identity"):
        opt.optimize()
    named = build(scheduler=locked).set_fit_identity("locked-schedule-v1")
    named.set_checkpoint(str(tmp_path / "named"), EveryEpoch()).optimize()
    assert named.iteration == ITERATIONS
    # without checkpoints nothing is hashed, so nothing is refused
    assert build(scheduler=locked).optimize() is not None
    # a logger a step logs to is identified by its name, a C object by what pickle saves
    import collections
    import datetime
    import logging
    log = logging.getLogger("user.step")
    queue = collections.deque([1, 2])
    day = datetime.date(2026, 1, 1)

    def logging_step(model, inputs, target):
        log.debug("%s %s", queue, day)
        return F.cross_entropy(model(*inputs), target)

    assert fit_identity(build(criterion=None, training_step=logging_step))


# ------------------------------------------------------------------------ the signature walk
def _other(name):
    """A second value for each DistriOptimizer argument (a new argument must be added here)."""
    return {
        "model": lambda: SmallNet(hidden=9),
        "criterion": lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.2),
        "optimizer": None,                      # built over the model: see below
        "batch_size": lambda: 10, "seed": lambda: 5,
        "lr_scheduler": lambda: "step",
        "lr_scheduler_step": lambda: "epoch", "micro_batch_size": lambda: 3,
        "shuffle": lambda: False, "compression": lambda: "bf16", "device": lambda: "cpu",
        "precision": lambda: "bf16-mixed", "train_transform": lambda: (lambda f, rng: f),
        "sequence_inputs": lambda: (0,), "padding_value": lambda: 2.0,
        "collate": lambda: (lambda inputs: inputs), "sample_weights": lambda: True,
        "training_step": lambda: scaled_step(2.0),
        "validation_step": lambda: (lambda model, inputs, target: model(*inputs)),
        "sub_replicas": lambda: 2,
    }[name]


def _engine(**changes):
    torch.manual_seed(5)
    net = changes.pop("model", None) or SmallNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2 if not changes.pop("other_lr", False)
                                else 0.3)
    scheduler = changes.pop("lr_scheduler", None)
    arguments = dict(batch_size=9, end_trigger=MaxEpoch(1), seed=4, lr_scheduler_step="iteration")
    arguments.update(changes)
    return DistriOptimizer(net, DATA, arguments.pop("criterion", torch.nn.CrossEntropyLoss()),
                           optimizer, lr_scheduler=(torch.optim.lr_scheduler.StepLR(optimizer, 2)
                                                    if scheduler == "step" else None),
                           **arguments)


def test_every_argument_and_setter_is_in_the_identity_or_named_as_not_deciding():
    base = fit_identity(_engine())
    for name in inspect.signature(DistriOptimizer.__init__).parameters:
        if name == "self" or name in NOT_IN_IDENTITY:
            continue
        if name == "optimizer":
            other = _engine(other_lr=True)
        else:
            other = _engine(**{name: _other(name)()})
        assert fit_identity(other) != base, f"{name} is not in the fit identity"
    setters = [n for n, _ in inspect.getmembers(DistriOptimizer, inspect.isfunction)
               if n.startswith("set_")]
    calls = {
        "set_gradient_clipping": lambda o: o.set_gradient_clipping(1.0),
        "set_constant_gradient_clipping": lambda o: o.set_constant_gradient_clipping(-1, 1),
        "set_validation": lambda o: o.set_validation(VALIDATION, EveryEpoch(), [Loss()]),
        "set_fit_identity": lambda o: o.set_fit_identity("v2"),
    }
    for setter in setters:
        assert setter in NOT_IN_IDENTITY or setter in SETTER_STATE, \
            f"{setter} is neither in the fit identity nor in NOT_IN_IDENTITY"
        if setter in SETTER_STATE:
            # validation decides the weights here: an EarlyStopping end trigger follows it
            deciding = MaxEpoch(3) | EarlyStopping("Loss", 1, restore_best=True)
            plain, changed = _engine(end_trigger=deciding), _engine(end_trigger=deciding)
            calls[setter](changed)
            assert fit_identity(changed) != fit_identity(plain), f"{setter} is not in it"
    # an EarlyStopping end trigger decides which weights are returned; MaxEpoch does not count
    assert fit_identity(_engine(end_trigger=MaxEpoch(7))) == base
    assert fit_identity(_engine(end_trigger=MaxEpoch(1) | EarlyStopping("Loss", 2))) != base


def _param_value(stage, name):
    """A second value for each estimator Param (a new Param must be added here)."""
    value = stage.getOrDefault(name)
    others = {"maxEpoch": 3, "featuresCol": "f2", "labelCol": "y", "batchSize": 7, "learningRate": 0.5,
              "momentum": 0.3, "seed": 9, "numTrainWorkers": 3, "validationIndicatorCol": "v",
              "featuresCols": ["a", "b"], "inputCols": ["a"], "featureShape": [2, 2],
              "optimizer": "sgd", "weightDecay": 0.1, "microBatchSize": 4, "subReplicas": 2,
              "device": "cpu", "precision": "bf16-mixed", "gradientClipNorm": 1.0,
              "earlyStoppingPatience": 2, "restoreBest": False, "sequenceCols": ["s"],
              "paddingValue": 1.0, "weightCol": "w", "validationMetrics": ["mae"],
              "lrScheduler": _scheduler(0.5), "fitIdentity": "named"}
    assert name in others, f"the Param {name} is in neither the identity test nor " \
                           "PARAMS_NOT_IN_IDENTITY: add it to one"
    assert others[name] != value
    return others[name]


@pytest.mark.parametrize("estimator", [NNEstimator, NNClassifier])
def test_every_estimator_param_is_in_the_identity_or_named_as_not_deciding(estimator):
    stage = estimator(model=SmallNet, criterion=torch.nn.CrossEntropyLoss())
    base = params_identity(stage, {})
    for param in stage.params:
        if param.name in PARAMS_NOT_IN_IDENTITY:
            continue
        changed = stage.copy({param: _param_value(stage, param.name)})
        assert params_identity(changed, {}) != base, f"{param.name} is not in the identity"


def test_a_grid_over_clipping_and_lambda_lr_with_checkpoint_dir_fits_every_setting(spark,
                                                                                   tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from df_helpers import mlp4, vector_df

    df = vector_df(spark, 120).repartition(2).cache()
    est = NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), batchSize=20,
                       maxEpoch=1, seed=0, progressBar=False, numTrainWorkers=2,
                       optimizer="sgd", learningRate=0.5)
    grid = (ParamGridBuilder().addGrid(est.gradientClipNorm, [0.0, 0.02])
            .addGrid(est.lrScheduler, [_scheduler_from_start(1.0),
                                       _scheduler_from_start(0.2)]).build())

    def tune(estimator):
        return CrossValidator(estimator=estimator, estimatorParamMaps=grid, numFolds=2, seed=1,
                              evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
                              collectSubModels=True, parallelism=2).fit(df)

    plain = tune(est)                                 # each setting's own fit, no checkpoints
    checked = tune(est.copy({est.checkpointDir: str(tmp_path)}))
    assert len(list(tmp_path.iterdir())) == 2 * 4 + 1          # every fold x setting + refit
    for fold in range(2):
        for j in range(len(grid)):
            assert bitwise_equal(checked.subModels[fold][j].module,
                                 plain.subModels[fold][j].module), (fold, j)
        # the settings differ from each other, so sharing a checkpoint could not go unseen
        modules = [plain.subModels[fold][j].module for j in range(len(grid))]
        assert not any(bitwise_equal(modules[a], modules[b])
                       for a in range(len(grid)) for b in range(a + 1, len(grid)))
    assert checked.avgMetrics == plain.avgMetrics


# ----------------------------------------------------------------- review: what users pass
class Recurrent(torch.nn.Module):
    """An LSTM (its flat weights are held through weak references) over the 6 features."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(1, 4, batch_first=True)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        out, _ = self.lstm(x.unsqueeze(-1))
        return self.head(out[:, -1])


def test_recurrent_scripted_and_compiled_models_have_a_stable_identity(tmp_path):
    opt = build(model=Recurrent).set_checkpoint(str(tmp_path), SeveralIteration(4))
    opt.optimize()
    again = build(model=Recurrent)
    again.end_trigger = MaxIteration(ITERATIONS + 2)
    again.set_checkpoint(str(tmp_path), SeveralIteration(4)).optimize()   # resumes its own
    assert [r.iteration for r in again.summary.iterations][:3] == [1, 2, 3]
    torch.manual_seed(0)
    scripted = torch.jit.script(torch.nn.Linear(3, 2))
    from sparkdl.engine.fit.resume.content_digest import content_digest
    assert content_digest(scripted, "m") == content_digest(scripted, "m")
    compiled = torch.compile(torch.nn.Linear(3, 2))
    twin = torch.compile(compiled._orig_mod)
    assert content_digest(compiled, "m") == content_digest(twin, "m")


def test_frozen_layers_and_parameter_groups_are_part_of_the_identity():
    base = fit_identity(_engine())
    frozen = _engine()
    frozen.model.fc1.weight.requires_grad_(False)
    assert fit_identity(frozen) != base

    def grouped(first_lr, second_lr):
        torch.manual_seed(5)
        net = SmallNet()
        groups = [{"params": net.fc1.parameters(), "lr": first_lr},
                  {"params": net.fc2.parameters(), "lr": second_lr}]
        return DistriOptimizer(net, DATA, torch.nn.CrossEntropyLoss(),
                               torch.optim.SGD(groups, lr=0.1), batch_size=9)

    assert fit_identity(grouped(0.1, 0.2)) != fit_identity(grouped(0.2, 0.1))


def test_a_named_fit_keeps_its_identity_whatever_its_unhashable_parts_hold():
    from concurrent.futures import ThreadPoolExecutor

    def with_pool():
        pool = ThreadPoolExecutor(1)          # threads and locks, different in every process
        scheduler = (lambda o: torch.optim.lr_scheduler.LambdaLR(
            o, lambda e: pool.submit(lambda: 0.9 ** e).result()))
        return build(scheduler=scheduler).set_fit_identity("pooled-v1")

    assert fit_identity(with_pool()) == fit_identity(with_pool())


def test_fits_of_one_identity_in_parallel_share_a_directory_one_after_the_other(tmp_path):
    """Two fits of one identity at once (a grid with a duplicate setting, fitted in parallel):
    the second waits for the first and resumes its end; a shorter run refuses a longer one's
    checkpoint instead of returning its weights."""
    results = []
    # built here, one after the other: build() seeds and draws from torch's global generator,
    # which two threads would interleave (the estimators build under private_torch_rng)
    fits = [build().set_checkpoint(str(tmp_path), SeveralIteration(2), by_fit=True)
            for _ in range(2)]

    def run(opt):
        results.append((opt.optimize(), opt))

    threads = [threading.Thread(target=run, args=(opt,)) for opt in fits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh = build().optimize()
    assert len(results) == 2 and all(bitwise_equal(m, fresh) for m, _ in results)
    assert sorted(len(o.summary.iterations) for _, o in results) == [ITERATIONS, ITERATIONS]
    shorter = build()
    shorter.end_trigger = MaxIteration(ITERATIONS - 2)
    with pytest.raises(CheckpointError, match=f"past this run's end at iteration "
                                              f"{ITERATIONS - 2}"):
        shorter.set_checkpoint(str(tmp_path), SeveralIteration(2), by_fit=True).optimize()
