"""Your own training step (issue 25): losses computed in forward, multi-part losses, Hugging Face
and Lightning models, each against single-process PyTorch calling the same step on the same union
batches; bad steps refused by the dry run; the estimators' trainingStep."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import JobCounter, bitwise_equal, classification_data, make_rdd, max_abs_diff
from sparkdl import (BatchPlan, DistriOptimizer, InvalidArgumentError, Loss,
                     ModelCriterionMismatchError, NNClassifier, Top1Accuracy, TrainingStepError)
from sparkdl.adapters import huggingface_step, lightning_arguments
from sparkdl.triggers import MaxIteration, SeveralIteration
from test_loss_normalisers_and_modes import Tagger, rows_weighted_reference, tagged_tokens

SIZES, BATCH, SEED, ITERATIONS = [50, 22, 38], 24, 5, 10
TOL = 1e-5


class LossInForward(torch.nn.Module):
    """Computes its loss in forward when given labels and returns a dict (a Hugging Face
    habit); without labels it returns the logits' dict only."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(6, 12)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x, labels=None):
        logits = self.head(torch.tanh(self.hidden(x)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


class WithHidden(torch.nn.Module):
    """Returns its logits and an intermediate activation."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(6, 12)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x):
        h = torch.relu(self.hidden(x))
        return self.head(h), h


def loss_in_forward_step(model, inputs, target):
    return model(*inputs, labels=target)["loss"]


def two_part_step(model, inputs, target):
    """The task loss plus an activity regulariser read from the intermediate output (both
    means over the rows)."""
    logits, hidden = model(*inputs)
    return F.cross_entropy(logits, target) + 0.05 * hidden.pow(2).mean()


def reference(net, inputs, target, step, plan, iterations, optimizer=None, scheduler=None,
              scheduler_every_iteration=False):
    """Single-process training calling ``step`` on each union batch."""
    optimizer = optimizer or torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.5)
    for t in range(iterations):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        optimizer.zero_grad()
        out = step(net, [torch.from_numpy(a[idx]) for a in inputs],
                   torch.from_numpy(target[idx]))
        loss = out[0] / out[1] if isinstance(out, tuple) else out
        loss.backward()
        optimizer.step()
        if scheduler is not None and scheduler_every_iteration:
            scheduler.step()
    return net


def engine(sc, net, records, step, sizes=SIZES, iterations=ITERATIONS, **kwargs):
    kwargs.setdefault("optimizer", torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.5))
    return DistriOptimizer(net, make_rdd(sc, records, sizes), training_step=step,
                           batch_size=kwargs.pop("batch_size", BATCH),
                           end_trigger=MaxIteration(iterations), seed=SEED, progress_bar=False,
                           **kwargs)


@pytest.mark.parametrize("net_class,step", [(LossInForward, loss_in_forward_step),
                                            (WithHidden, two_part_step)],
                         ids=["dict-output-loss-in-forward", "two-part-loss"])
def test_training_step_equals_single_process(sc, net_class, step):
    x, y = classification_data(sum(SIZES), d=6, seed=4)
    torch.manual_seed(2)
    net = net_class()
    start = copy.deepcopy(net)
    engine(sc, net, list(zip(x, y)), step, micro_batch_size=7).optimize()
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    expected = reference(copy.deepcopy(start), [x], y, step, plan, ITERATIONS)
    assert max_abs_diff(net, expected) <= TOL
    assert max_abs_diff(net, start) > 1e-2          # it trained


def masked_step(model, inputs, target):
    """A token-level loss over the tokens that are not padding, as (sum, count)."""
    scores = model(*inputs)
    mask = target != -100
    per_token = F.cross_entropy(scores, target.clamp(min=0), reduction="none")
    return (per_token * mask).sum(), mask.sum()


def test_loss_sum_and_normaliser_is_exact_with_padding_in_one_partition(sc):
    sizes = [40, 30, 34]
    ids, tags = tagged_tokens(sum(sizes), 1, sizes)
    torch.manual_seed(1)
    net = Tagger()
    start = copy.deepcopy(net)
    opt = engine(sc, net, list(zip(ids, tags)), masked_step, sizes=sizes, iterations=12,
                 batch_size=28, optimizer=torch.optim.SGD(net.parameters(), lr=0.5,
                                                          momentum=0.5))
    opt.optimize()
    plan = BatchPlan(sizes, 28, SEED, True)
    expected = copy.deepcopy(start)
    optimizer = torch.optim.SGD(expected.parameters(), lr=0.5, momentum=0.5)
    reference(expected, [ids], tags, masked_step, plan, 12, optimizer)
    assert max_abs_diff(net, expected) <= TOL
    # the per-task row-weighted mean would be far off: the test tells the rules apart
    rows = rows_weighted_reference(copy.deepcopy(start), ids, tags,
                                   torch.nn.CrossEntropyLoss(), plan, 12)
    assert max_abs_diff(rows, expected) > 100 * TOL
    # the reported loss is the union batch's masked mean
    idx = plan.global_indices(*plan.epoch_and_step(0))
    total, count = masked_step(start, [torch.from_numpy(ids[idx])], torch.from_numpy(tags[idx]))
    assert opt.summary.iterations[0].loss == pytest.approx(float(total.detach() / count), rel=1e-6)


def tiny_bert(num_labels=3, seed=0):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=24, max_position_embeddings=16,
                        num_labels=num_labels, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def token_rows(n, length=8, seed=0):
    """Token ids with right padding (0) and their attention masks; the label is a function of
    the first token."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 40, (n, length))
    lengths = rng.integers(2, length + 1, n)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids = (ids * mask).astype(np.int64)
    return ids, mask, (ids[:, 0] % 3).astype(np.int64)


def test_huggingface_model_with_its_own_loss_equals_single_process(sc):
    ids, mask, labels = token_rows(sum(SIZES))
    net = tiny_bert()
    start = copy.deepcopy(net)
    step = huggingface_step(("input_ids", "attention_mask"))
    records = [((i, m), y) for i, m, y in zip(ids, mask, labels)]
    opt = engine(sc, net, records, step,
                 optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2))
    opt.set_validation(make_rdd(sc, records[:40], [25, 15]), SeveralIteration(5),
                       [Top1Accuracy(), Loss()])
    opt.optimize()
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    expected = copy.deepcopy(start)
    reference(expected, [ids, mask], labels, step, plan, ITERATIONS,
              torch.optim.AdamW(expected.parameters(), lr=1e-2))
    assert max_abs_diff(net, expected) <= TOL
    # validation read the logits of the model's dict output and the step's own loss
    expected.eval()
    with torch.no_grad():
        out = expected(torch.from_numpy(ids[:40]), torch.from_numpy(mask[:40]),
                       labels=torch.from_numpy(labels[:40]))
    metrics = opt.summary.validations[-1].metrics
    assert metrics["Top1Accuracy"] == pytest.approx(
        float((out.logits.argmax(-1).numpy() == labels[:40]).mean()))
    assert metrics["Loss"] == pytest.approx(float(out.loss), rel=1e-5)


def lightning_module_class():
    import lightning

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(),
                                           torch.nn.Linear(10, 3))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return {"loss": loss}

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.3, momentum=0.5)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return Classifier


def test_lightning_module_equals_single_process(sc):
    x, y = classification_data(sum(SIZES), d=6, seed=6)
    Classifier = lightning_module_class()
    torch.manual_seed(3)
    module = Classifier()
    start = copy.deepcopy(module)
    arguments = lightning_arguments(module)
    assert arguments["lr_scheduler_step"] == "iteration"
    DistriOptimizer(module, make_rdd(sc, list(zip(x, y)), SIZES), batch_size=BATCH,
                    end_trigger=MaxIteration(ITERATIONS), seed=SEED, progress_bar=False,
                    **arguments).optimize()
    # single process: Lightning's own loop over the same batches (training_step, the optimizer
    # and the per-step scheduler from configure_optimizers)
    expected = copy.deepcopy(start)
    config = expected.configure_optimizers()
    plan = BatchPlan(SIZES, BATCH, SEED, True)

    def step(model, inputs, target):
        return model.training_step((*inputs, target), 0)["loss"]

    reference(expected, [x], y, step, plan, ITERATIONS, config["optimizer"],
              config["lr_scheduler"]["scheduler"], scheduler_every_iteration=True)
    assert max_abs_diff(module, expected) <= TOL
    assert arguments["optimizer"].param_groups[0]["lr"] == pytest.approx(0.3 * 0.5 ** 3)


# ------------------------------------------------------------------------------ bad steps
def _jobs_until_refused(sc, error, message, **arguments):
    """How many Spark jobs a run that the dry run refuses has started."""
    x, y = classification_data(40, d=6, seed=1)
    net = WithHidden()
    before = copy.deepcopy(net.state_dict())
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [20, 20]),
                          optimizer=torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                          end_trigger=MaxIteration(2), progress_bar=False, **arguments)
    with JobCounter(sc) as jobs, pytest.raises(error, match=message):
        opt.optimize()
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    assert not opt.summary.iterations                       # no iteration ran
    return jobs.count


def _refused(sc, step, message):
    refused = _jobs_until_refused(sc, TrainingStepError, message, training_step=step)
    # the same jobs as a criterion the dry run refuses: only those caching the shards (whose
    # rows feed the dry run), no gradient job
    baseline = _jobs_until_refused(sc, Exception, None, criterion=torch.nn.MSELoss())
    assert refused == baseline


@pytest.mark.parametrize("step,message", [
    (lambda m, i, t: F.cross_entropy(m(*i)[0], t, reduction="none"),
     r"scalar tensor \(one value\); it returned a tensor of shape \(\d+,\)"),
    (lambda m, i, t: F.cross_entropy(m(*i)[0], t).item(), "it returned a float"),
    (lambda m, i, t: F.cross_entropy(m(*i)[0], t).detach(), "without grad"),
    (lambda m, i, t: (F.cross_entropy(m(*i)[0], t, reduction="sum"), "n"),
     "normaliser must be a number"),
    (lambda m, i, t: m(*i, labels=t), r"cannot run on the training rows.*TypeError"),
], ids=["non-scalar", "non-tensor", "no-grad", "bad-normaliser", "raises"])
def test_bad_training_step_is_refused_by_the_dry_run(sc, step, message):
    _refused(sc, step, message)


def test_criterion_or_training_step_is_required():
    net = WithHidden()
    with pytest.raises(InvalidArgumentError, match="needs a criterion .* or a training_step"):
        DistriOptimizer(net, make_rdd_free(), optimizer=torch.optim.SGD(net.parameters(), 0.1),
                        batch_size=8)
    with pytest.raises(InvalidArgumentError, match="'training_step'"):
        DistriOptimizer(net, make_rdd_free(), optimizer=torch.optim.SGD(net.parameters(), 0.1),
                        batch_size=8, training_step="loss")
    with pytest.raises(InvalidArgumentError, match="'optimizer'"):
        DistriOptimizer(net, make_rdd_free(), training_step=two_part_step, batch_size=8)


def make_rdd_free():
    from sparkdl.runners import LocalPartitions

    x, y = classification_data(10, d=6, seed=0)
    return LocalPartitions([list(zip(x, y))])


# ------------------------------------------------------------------------------ estimators
def test_estimator_training_step_is_bitwise_the_criterion_and_persists(spark, tmp_path):
    """A step computing criterion(model(x), y) trains bitwise the same weights as that
    criterion (the row mean travels as (sum, rows); the driver's division is by 1.0); the
    estimator saved with its trainingStep and loaded trains them again."""
    x, y = classification_data(90, d=6, seed=8)
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                               ["features", "label"]).repartition(2)

    def factory():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(),
                                   torch.nn.Linear(8, 3))

    def ce_step(model, inputs, target):
        return F.cross_entropy(model(*inputs), target)

    common = dict(model=factory, batchSize=16, maxEpoch=2, learningRate=0.1, seed=1,
                  progressBar=False)
    with_criterion = NNClassifier(criterion=torch.nn.CrossEntropyLoss(), **common).fit(df)
    estimator = NNClassifier(trainingStep=ce_step, **common)
    with_step = estimator.fit(df)
    assert bitwise_equal(with_step.module, with_criterion.module)
    path = str(tmp_path / "estimator")
    estimator.write().save(path)
    loaded = NNClassifier.load(path)
    assert loaded.training_step is not None and loaded.criterion is None
    assert bitwise_equal(loaded.fit(df).module, with_step.module)
    predictions = with_step.transform(df).select("prediction").toPandas()
    assert set(predictions["prediction"]) <= {0.0, 1.0, 2.0}


def test_estimator_trains_a_huggingface_model_from_token_id_columns(spark):
    """NNClassifier with huggingface_step on columns of token ids: the same weights as the
    engine on the same rows, validation loss from the step, transform reads the logits."""
    ids, mask, labels = token_rows(60, seed=3)
    rows = [(i.tolist(), m.tolist(), int(y), k % 4 == 0)
            for k, (i, m, y) in enumerate(zip(ids, mask, labels))]
    df = spark.createDataFrame(rows, ["input_ids", "attention_mask", "label", "is_val"])
    clf = NNClassifier(model=lambda: tiny_bert(seed=1),
                       trainingStep=huggingface_step(("input_ids", "attention_mask")),
                       inputCols=["input_ids", "attention_mask"], labelCol="label",
                       validationIndicatorCol="is_val", optimizer="adamw", learningRate=0.01,
                       batchSize=15, maxEpoch=2, seed=2, progressBar=False)
    model = clf.fit(df)
    summary = model.summary
    assert {"validation_Loss", "validation_Top1Accuracy"} <= set(summary.columns)
    assert np.isfinite(summary["validation_Loss"]).all()
    out = model.transform(df).select("prediction", "probability").toPandas()
    assert len(out) == 60 and out["probability"].map(len).eq(3).all()


# ------------------------------------------------------------------------------ the contract
def _linear_output():
    net = torch.nn.Linear(3, 1)
    return net, net(torch.ones(4, 3)).reshape(-1)


def test_step_contract_edges_without_spark():
    from sparkdl.training_step import step_loss_terms

    net, out = _linear_output()
    target = torch.zeros(4)
    # no term counts: a gradless zero sum with normaliser 0 contributes nothing
    assert step_loss_terms(lambda m, i, t: (torch.tensor(0.0), 0), net, [], target) == \
        (None, 0.0, 0.0)
    with pytest.raises(TrainingStepError, match="finite and >= 0"):
        step_loss_terms(lambda m, i, t: (out.sum(), float("inf")), net, [], target)
    with pytest.raises(TrainingStepError, match="finite and >= 0"):
        step_loss_terms(lambda m, i, t: (out.sum(), -1), net, [], target)
    loss, multiplier, normaliser = step_loss_terms(lambda m, i, t: out.mean(), net, [], target)
    assert (multiplier, normaliser) == (4.0, 4.0) and loss.requires_grad


def test_huggingface_step_counts_labels_as_the_model_does():
    class TinyForCausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, input_ids, labels=None):
            return {"loss": self.w * 2.0, "logits": input_ids.float()}

    labels = torch.tensor([[5, 6, -100, -100], [7, 8, 9, 10]])
    total, counted = huggingface_step(("input_ids",))(TinyForCausalLM(), [labels], labels)
    assert int(counted) == 1 + 3                       # first position of each row not counted
    assert float(total) == pytest.approx(2.0 * 4)
    _, unshifted = huggingface_step(("input_ids",), shift_labels=False)(
        TinyForCausalLM(), [labels], labels)
    assert int(unshifted) == 6
    with pytest.raises(TrainingStepError, match="names 2 input"):
        huggingface_step(("input_ids", "attention_mask"))(TinyForCausalLM(), [labels], labels)


def test_validation_reads_the_validation_step_and_needs_no_model_call_for_the_step_loss():
    """In process: a model whose forward needs labels validates with Loss() alone (the step's
    loss, eval mode), and a validation_step feeds Top1Accuracy; both equal single process."""
    from sparkdl.runners import LocalPartitions

    class NeedsLabels(LossInForward):
        def forward(self, x, labels):
            return super().forward(x, labels)

    x, y = classification_data(60, d=6, seed=9)
    records = list(zip(x, y))
    torch.manual_seed(4)
    net = NeedsLabels()
    opt = DistriOptimizer(net, LocalPartitions([records[:35], records[35:]]),
                          optimizer=torch.optim.SGD(net.parameters(), lr=0.2), batch_size=20,
                          end_trigger=MaxIteration(3), training_step=loss_in_forward_step,
                          validation_step=lambda m, i, t: m(*i, labels=t)["logits"],
                          progress_bar=False)
    opt.set_validation(LocalPartitions([records[:25], records[25:]]), SeveralIteration(3),
                       [Loss(), Top1Accuracy()])
    opt.optimize()
    net.eval()
    with torch.no_grad():
        out = net(torch.from_numpy(x), torch.from_numpy(y))
    metrics = opt.summary.validations[-1].metrics
    assert metrics["Loss"] == pytest.approx(float(out["loss"]), rel=1e-5)
    assert metrics["Top1Accuracy"] == pytest.approx(
        float((out["logits"].argmax(1).numpy() == y).mean()))


def test_estimator_refuses_a_model_transform_cannot_read_before_training(spark):
    x, y = classification_data(40, d=6, seed=8)
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                               ["features", "label"])
    clf = NNClassifier(model=WithHidden, trainingStep=two_part_step, batchSize=10, maxEpoch=1,
                       progressBar=False)
    with pytest.raises(ModelCriterionMismatchError, match="transform reads the predictions"):
        clf.fit(df)


def test_the_docstring_example_step_is_exact_under_padding():
    """sparkdl.training_step's example step for a Hugging Face model (whose ``.loss`` is a mean
    over the labels that are not -100) returns ``(loss_sum, normaliser)``, so two tasks with
    different padding combine to the single-process token mean (issue 35); returned as a row
    mean, the task with more padding would weigh its few tokens more."""
    import textwrap
    from types import SimpleNamespace

    import sparkdl.training_step as training_step
    from sparkdl.training_step import step_loss_terms

    doc = training_step.__doc__
    code = textwrap.dedent(doc[doc.index("Example::") + len("Example::"):
                               doc.index("    def masked_step")])
    namespace = {"torch": torch}
    exec(code, namespace)                    # noqa: S102 - the module's own example
    step = namespace["step"]

    class TinyTokenClassifier(torch.nn.Module):
        """Scores per token and, given labels, their mean cross-entropy over the counted
        labels, as a Hugging Face token classifier computes its ``loss``."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.scores = torch.nn.Embedding(10, 3, dtype=torch.float64)

        def forward(self, input_ids, labels=None):
            logits = self.scores(input_ids)
            loss = F.cross_entropy(logits.reshape(-1, 3), labels.reshape(-1), ignore_index=-100)
            return SimpleNamespace(loss=loss, logits=logits)

    model = TinyTokenClassifier()
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 1, 2, 3], [4, 5, 6, 7]])
    labels = torch.tensor([[0, 1, 2, 0], [1, 2, 0, 1], [2, -100, -100, -100],
                           [0, 1, -100, -100]])
    tasks = [(ids[:2], labels[:2]), (ids[2:], labels[2:])]       # padding only in the second
    terms = [step_loss_terms(step, model, [i], t) for i, t in tasks]
    combined = sum(loss * m for loss, m, _ in terms) / sum(n for _, _, n in terms)
    single = model(input_ids=ids, labels=labels).loss             # one process, all tokens
    assert float(combined.detach()) == pytest.approx(float(single.detach()), rel=1e-12, abs=0)
    assert [n for _, _, n in terms] == [8.0, 3.0]
