"""Exact where users really are (issue 22, acceptance 1 and 4): losses whose normaliser is not
the row count (ignore_index, class weights, a declared normaliser), submodules left in eval and
frozen parameters, metric-driven LR schedulers, the estimators' optimizer factory and float64
labels, each against single-process PyTorch on the same union batches."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from df_helpers import SequenceMeanNet, id_sequences
from models import bitwise_equal, make_rdd, max_abs_diff
from sparkdl import BatchPlan, DistriOptimizer, InvalidArgumentError, NNEstimator
from sparkdl.data.ragged import Ragged
from sparkdl.metrics import Loss
from sparkdl.triggers import EveryEpoch, MaxEpoch, MaxIteration

SIZES, BATCH, SEED, ITERATIONS = [60, 36, 44], 28, 7, 12
T, VOCAB, CLASSES = 6, 30, 4


class Tagger(torch.nn.Module):
    """One label per token: ids [B, T] -> scores [B, C, T]."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.out = torch.nn.Linear(8, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(ids))).permute(0, 2, 1)


def tagged_tokens(n: int, padded_partition: int, sizes: list[int], seed: int = 0):
    """Token ids and tags; rows of ``padded_partition`` are mostly padding (tag -100), the
    others nearly full, so the partitions' shares of rows and of targets differ widely."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, T))
    tags = (ids % CLASSES).astype(np.int64)
    flip = rng.random((n, T)) < 0.2
    tags[flip] = rng.integers(0, CLASSES, int(flip.sum()))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    lengths = rng.integers(T - 1, T + 1, n)
    a, b = bounds[padded_partition], bounds[padded_partition + 1]
    lengths[a:b] = rng.integers(1, 3, b - a)
    pad = np.arange(T)[None, :] >= lengths[:, None]
    ids[pad], tags[pad] = 0, -100
    return ids.astype(np.int64), tags


MISSING = -999.0


class MaskedMSE(torch.nn.Module):
    """A custom criterion declaring its normaliser: the mean over the targets that are present
    (not ``MISSING``)."""

    def sum_and_normaliser(self, output, target):
        mask = target != MISSING
        return ((output - target) ** 2 * mask).sum(), mask.sum()

    def forward(self, output, target):
        total, count = self.sum_and_normaliser(output, target)
        return total / count


def train_reference(net, inputs, y, criterion, plan, iterations, lr=0.5):
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.5)
    for t in range(iterations):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        optimizer.zero_grad()
        criterion(net(torch.from_numpy(inputs[idx])), torch.from_numpy(y[idx])).backward()
        optimizer.step()
    return net


def rows_weighted_reference(net, inputs, y, criterion, plan, iterations, lr=0.5):
    """What sparkdl computed before: each partition's mean weighted by its share of the rows.
    The tests assert this differs, so they can tell the two rules apart."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.5)
    for t in range(iterations):
        epoch, step = plan.epoch_and_step(t)
        counts = plan.shares(epoch, step)[1]
        optimizer.zero_grad()
        for p, count in enumerate(counts):
            if count == 0:
                continue
            local = plan.offsets[p] + plan.local_indices(epoch, step, p)
            loss = criterion(net(torch.from_numpy(inputs[local])), torch.from_numpy(y[local]))
            (loss * (count / counts.sum())).backward()
        optimizer.step()
    return net


CRITERIA = {
    "ce-ignore-index": lambda: torch.nn.CrossEntropyLoss(),
    "ce-ignore-index-class-weights": lambda: torch.nn.CrossEntropyLoss(
        weight=torch.tensor([0.2, 1.0, 3.0, 0.7]), ignore_index=-100),
    "nll-ignore-index": lambda: torch.nn.NLLLoss(ignore_index=-100),
}


@pytest.mark.parametrize("name", list(CRITERIA))
def test_masked_and_class_weighted_losses_equal_single_process(sc, name):
    ids, tags = tagged_tokens(sum(SIZES), 1, SIZES)
    criterion = CRITERIA[name]()
    torch.manual_seed(1)
    net = Tagger() if "nll" not in name else torch.nn.Sequential(
        Tagger(), torch.nn.LogSoftmax(dim=1))
    start = copy.deepcopy(net)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(ids, tags)), SIZES), criterion,
                          torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.5),
                          batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                          micro_batch_size=5, progress_bar=False)
    opt.optimize()
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    reference = train_reference(copy.deepcopy(start), ids, tags, criterion, plan, ITERATIONS)
    assert max_abs_diff(net, reference) <= 1e-5
    old_rule = rows_weighted_reference(copy.deepcopy(start), ids, tags, criterion, plan,
                                       ITERATIONS)
    assert max_abs_diff(old_rule, reference) > 1e-3, "the data cannot tell the rules apart"
    # the reported batch loss is the union's mean loss too
    idx = plan.global_indices(0, 0)
    with torch.no_grad():
        first = float(criterion(start(torch.from_numpy(ids[idx])), torch.from_numpy(tags[idx])))
    assert abs(opt.summary.iterations[0].loss - first) <= 1e-6


def test_a_criterion_declaring_its_normaliser_is_exact_and_validated(sc):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(sum(SIZES), 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 3))).astype(np.float32)
    y[60:96, 1:] = MISSING                  # partition 1: one target of three per row
    y[rng.random(y.shape) < 0.1] = MISSING
    torch.manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    start = copy.deepcopy(net)
    rdd = make_rdd(sc, list(zip(x, y)), SIZES)
    opt = DistriOptimizer(net, rdd, MaskedMSE(),
                          torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.5),
                          batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                          progress_bar=False)
    opt.set_validation(rdd, MaxIteration(ITERATIONS), [Loss()])
    opt.optimize()
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    reference = train_reference(copy.deepcopy(start), x, y, MaskedMSE(), plan, ITERATIONS, 0.1)
    assert max_abs_diff(net, reference) <= 1e-5
    with torch.no_grad():      # validation: the mean over every present target of the set
        whole = float(MaskedMSE()(reference(torch.from_numpy(x)), torch.from_numpy(y)))
    assert abs(opt.summary.validations[-1].metrics["Loss"] - whole) <= 1e-5


class LogSoftmaxSequences(SequenceMeanNet):
    def forward(self, *args):
        return torch.log_softmax(super().forward(*args), dim=1)


def partitioned_frame(spark, rows, sizes):
    """A DataFrame whose partition i holds the next sizes[i] rows, in order."""
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [rows[bounds[i]:bounds[i + 1]] for i in range(len(sizes))]
    rdd = spark.sparkContext.parallelize(range(len(sizes)), len(sizes)).mapPartitionsWithIndex(
        lambda i, _: iter(parts[i]))
    schema = StructType([StructField("ids", ArrayType(LongType())),
                         StructField("label", LongType())])
    return spark.createDataFrame(rdd, schema)


def test_nll_with_ignore_index_through_sequence_cols_equals_single_process(spark):
    sizes = [70, 40, 50]
    rows, labels = id_sequences(sum(sizes), seed=5)
    labels = labels.astype(np.int64)
    labels[70:110][np.random.default_rng(0).random(40) < 0.8] = -100   # unlabelled rows
    labels[::9] = -100
    df = partitioned_frame(spark, [([int(i) for i in r], int(c)) for r, c in zip(rows, labels)],
                           sizes)
    torch.manual_seed(8)
    net = LogSoftmaxSequences()
    start = copy.deepcopy(net)
    est = NNEstimator(model=net, criterion=torch.nn.NLLLoss(ignore_index=-100),
                      featuresCol="ids", sequenceCols=["ids"], labelCol="label", batchSize=32,
                      maxEpoch=3, numTrainWorkers=3, seed=SEED, progressBar=False,
                      optimizerFactory=lambda p, lr: torch.optim.SGD(p, lr=lr),
                      learningRate=0.5)
    fitted = est.fit(df)
    plan = BatchPlan(sizes, 32, SEED, True)
    reference = copy.deepcopy(start)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for t in range(3 * plan.iterations_per_epoch):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        padded, lengths = Ragged.from_rows([rows[i] for i in idx], np.int64).pad(0)
        optimizer.zero_grad()
        torch.nn.functional.nll_loss(reference(torch.from_numpy(padded),
                                               torch.from_numpy(lengths)),
                                     torch.from_numpy(labels[idx]), ignore_index=-100).backward()
        optimizer.step()
    assert plan.iterations_per_epoch * 3 >= 10
    assert max_abs_diff(fitted.module, reference) <= 1e-5
    assert max_abs_diff(fitted.module, start) > 1e-2


class FrozenBackbone(torch.nn.Module):
    """A pre-trained part (BatchNorm and Dropout in eval, weights frozen) under a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.BatchNorm1d(10),
                                            torch.nn.Dropout(0.5), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.BatchNorm1d(10),
                                        torch.nn.Linear(10, 3))

    def forward(self, x):
        return self.head(self.backbone(x))


def frozen_model():
    torch.manual_seed(4)
    net = FrozenBackbone()
    with torch.no_grad():   # "pre-trained" running statistics
        net.backbone[1].running_mean.uniform_(-1, 1)
        net.backbone[1].running_var.uniform_(0.5, 2)
    net.backbone.eval()
    for p in net.backbone.parameters():
        p.requires_grad_(False)
    return net


def test_submodules_left_in_eval_and_frozen_parameters_stay_as_the_user_left_them(sc):
    from models import classification_data

    x, y = classification_data(sum(SIZES), seed=9)
    net = frozen_model()
    start = copy.deepcopy(net)
    modes = [m.training for m in net.modules()]
    trainable = [p for p in net.parameters() if p.requires_grad]
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(trainable, lr=0.2), batch_size=BATCH,
                          end_trigger=MaxIteration(ITERATIONS), seed=SEED, progress_bar=False)
    opt.optimize()
    assert [m.training for m in net.modules()] == modes, "the modes changed after training"
    frozen, before = net.backbone.state_dict(), start.backbone.state_dict()
    assert all(torch.equal(frozen[k], before[k]) for k in before), "the frozen part moved"
    head_bn = net.head[1]
    assert not torch.equal(head_bn.running_mean, start.head[1].running_mean), "head BN trains"
    # single process: the same modes, the same batches (the head's BatchNorm, in train mode,
    # normalises each partition's rows by their own statistics: one reference step per
    # partition-share would be needed for it, so compare the frozen part and the weights of a
    # BatchNorm-free head instead)
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    torch.manual_seed(4)
    simple = frozen_model()
    simple.head = torch.nn.Linear(10, 3)
    simple_start = copy.deepcopy(simple)
    opt = DistriOptimizer(simple, make_rdd(sc, list(zip(x, y)), SIZES),
                          torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD([p for p in simple.parameters() if p.requires_grad],
                                          lr=0.2),
                          batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                          progress_bar=False)
    opt.optimize()
    reference = copy.deepcopy(simple_start)
    optimizer = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.2)
    for t in range(ITERATIONS):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(torch.from_numpy(x[idx])),
                                          torch.from_numpy(y[idx])).backward()
        optimizer.step()
    assert max_abs_diff(simple, reference) <= 1e-5
    assert bitwise_equal(simple.backbone, simple_start.backbone)
    # the old rule (everything in train mode) would have moved the frozen BatchNorm's stats
    train_mode = copy.deepcopy(simple_start).train()
    with torch.no_grad():
        train_mode(torch.from_numpy(x[:BATCH]))
    assert not torch.equal(train_mode.backbone[1].running_mean,
                           simple_start.backbone[1].running_mean)


def plateau_reference(net, x, y, plan, epochs, validation=None):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.4)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0,
                                                           threshold=0.25)
    lrs = []
    for epoch in range(epochs):
        losses, counts = [], []
        for step in range(plan.iterations_per_epoch):
            idx = plan.global_indices(epoch, step)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x[idx])),
                                                     torch.from_numpy(y[idx]))
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            counts.append(len(idx))
        if validation is not None:
            with torch.no_grad():
                metric = float(torch.nn.functional.cross_entropy(
                    net(torch.from_numpy(validation[0])), torch.from_numpy(validation[1])))
        else:
            metric = float(np.dot(losses, counts) / np.sum(counts))
        scheduler.step(metric)
        lrs.append(optimizer.param_groups[0]["lr"])
    return net, lrs


@pytest.mark.parametrize("with_validation", [False, True])
def test_reduce_lr_on_plateau_equals_single_process(sc, with_validation):
    from models import SmallNet, classification_data

    x, y = classification_data(sum(SIZES), seed=2)
    xv, yv = classification_data(50, seed=3)
    yv = np.random.default_rng(1).integers(0, 3, 50)    # noise: the validation loss plateaus
    torch.manual_seed(0)
    net = SmallNet()
    start = copy.deepcopy(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.4)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0,
                                                           threshold=0.25)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          optimizer, batch_size=BATCH, end_trigger=MaxEpoch(4), seed=SEED,
                          lr_scheduler=scheduler, progress_bar=False)
    if with_validation:
        opt.set_validation(make_rdd(sc, list(zip(xv, yv)), [30, 20]), EveryEpoch(), [Loss()])
    opt.optimize()
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    reference, lrs = plateau_reference(copy.deepcopy(start), x, y, plan, 4,
                                       (xv, yv) if with_validation else None)
    assert len(set(lrs)) > 1, "the plateau never reduced the learning rate: the test is blind"
    assert optimizer.param_groups[0]["lr"] == lrs[-1]
    assert max_abs_diff(net, reference) <= 1e-5


def test_a_scheduler_that_cannot_be_served_is_refused_before_any_job(sc):
    from models import SmallNet

    net = SmallNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    rdd = sc.parallelize([(np.zeros(6, np.float32), 0)])
    with pytest.raises(InvalidArgumentError, match="mode='max'.*use mode='min'"):
        DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(), optimizer, batch_size=4,
                        lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer,
                                                                                mode="max"))

    class TwoArguments:
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self, metric, other):    # noqa: D102
            pass

    with pytest.raises(InvalidArgumentError, match=r"needs 2 arguments \(metric, other\)"):
        DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(), optimizer, batch_size=4,
                        lr_scheduler=TwoArguments(optimizer))


def regression_rows(n=90, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    # targets near 1e4 with digits below float32's resolution there (~1e-3)
    y = 1e4 + x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=n) * 1e-4
    return x, y


def test_float64_models_get_float64_labels(spark):
    x, y = regression_rows()
    df = spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(x, y)],
                               ["features", "y"]).coalesce(1)
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0)).double()
    with torch.no_grad():
        net[0].bias.fill_(1e4)
    start = copy.deepcopy(net)
    est = NNEstimator(model=net, criterion=torch.nn.MSELoss(), labelCol="y", batchSize=30,
                      maxEpoch=2, numTrainWorkers=1, seed=SEED, progressBar=False,
                      optimizerFactory=lambda p, lr: torch.optim.SGD(p, lr=lr),
                      learningRate=0.01)
    fitted = est.fit(df)
    plan = BatchPlan([len(y)], 30, SEED, True)

    def mse_reference(targets):
        net = copy.deepcopy(start)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        for t in range(2 * plan.iterations_per_epoch):
            idx = plan.global_indices(*plan.epoch_and_step(t))
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(torch.from_numpy(x[idx])),
                                         torch.from_numpy(targets[idx])).backward()
            optimizer.step()
        return net

    reference = mse_reference(y)
    assert max_abs_diff(fitted.module, reference) <= 1e-9
    # labels rounded through float32 (as before) end measurably elsewhere
    rounded = mse_reference(y.astype(np.float32).astype(np.float64))
    assert max_abs_diff(rounded, reference) > 1e-7


def test_optimizer_factory_takes_the_optimizer_params_or_refuses_them(spark):
    x, y = regression_rows(40)
    df = spark.createDataFrame([(r.tolist(), float(t) - 1e4) for r, t in zip(x, y)],
                               ["features", "y"]).coalesce(1)

    def make(lr_value):
        torch.manual_seed(0)
        est = NNEstimator(model=torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0)),
                          criterion=torch.nn.MSELoss(), labelCol="y", batchSize=20,
                          maxEpoch=1, numTrainWorkers=1, seed=SEED, progressBar=False,
                          optimizerFactory=lambda p, lr, weight_decay: torch.optim.SGD(
                              p, lr=lr, weight_decay=weight_decay))
        return est.copy({est.learningRate: lr_value, est.weightDecay: 0.01})

    a, b = make(0.01).fit(df).module, make(0.2).fit(df).module
    assert max_abs_diff(a, b) > 1e-3, "a grid over learningRate must train different models"
    plain = NNEstimator(model=torch.nn.Linear(3, 1), criterion=torch.nn.MSELoss(),
                        labelCol="y", optimizerFactory=lambda p: torch.optim.SGD(p, lr=0.1),
                        learningRate=0.5, momentum=0.9)
    with pytest.raises(InvalidArgumentError, match="learningRate, momentum, which the factory "
                                                   "would ignore"):
        plain.fit(df)


def test_one_top1_accuracy_rule(spark):
    from sparkdl import NNClassifier
    from sparkdl.metrics import Top1Accuracy

    logits = torch.tensor([[-0.3], [0.2], [0.7], [-2.0]])
    target = torch.tensor([0, 1, 1, 1])
    as_logits = Top1Accuracy().partial(logits, target, torch.nn.BCEWithLogitsLoss())
    assert as_logits.tolist() == [3.0, 4.0]                 # > 0: 0.2 and 0.7 are class 1
    probabilities = torch.sigmoid(logits)
    as_probabilities = Top1Accuracy().partial(probabilities, target, torch.nn.BCELoss())
    assert as_probabilities.tolist() == as_logits.tolist()  # > 0.5 on the same rows
    assert Top1Accuracy(threshold=0.5).partial(logits, target, None).tolist() == [2.0, 4.0]
    df = spark.createDataFrame([([0.0, 1.0], 1)], ["features", "label"])
    clf = NNClassifier(model=torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Sigmoid()),
                       criterion=torch.nn.BCELoss())
    with pytest.raises(InvalidArgumentError, match="BCEWithLogitsLoss"):
        clf.fit(df)
