"""Real models, exactly: each model of the zoo trained by the engine equals single-process
PyTorch on the same union batches (issue: real models, acceptance 1 to 3)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models import SmallNet, make_rdd, max_abs_diff, reference_train
from sparkdl import BatchPlan, DistriOptimizer, InvalidArgumentError, Top1Accuracy
from sparkdl.triggers import MaxIteration
from zoo_models import (BatchNormCNN, CounterNet, DictOutput, GRUClassifier, LogitsLoss,
                        Recommender, TinyTransformer, UnusedBranch, partitioned_reference_train)

SIZES = [50, 30, 40]      # uneven, three partitions
BATCH = 24
ITERATIONS = 20
SEED = 5


def records_of(inputs, y):
    if len(inputs) == 1:
        return list(zip(inputs[0], y))
    return [(tuple(a[k] for a in inputs), y[k]) for k in range(len(y))]


def run_engine(sc, model, inputs, y, criterion, make_optimizer, sizes=SIZES,
               iterations=ITERATIONS, **kwargs):
    net = copy.deepcopy(model)
    optimizer = make_optimizer(net)
    opt = DistriOptimizer(net, make_rdd(sc, records_of(inputs, y), sizes), criterion, optimizer,
                          batch_size=BATCH, end_trigger=MaxIteration(iterations), seed=SEED,
                          progress_bar=False, **kwargs)
    return opt.optimize(), opt


def classification(n, d=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(d, classes)), axis=1).astype(np.int64)
    return x, y


def tokens(n, length, vocab, seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(1, vocab, size=(n, length)).astype(np.int64)
    y = ((t[:, 0] + t[:, -1]) % 3).astype(np.int64)
    return t, y


def sgd(lr=0.1, momentum=0.9):
    return lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)


def plan():
    return BatchPlan(SIZES, BATCH, SEED)


def check_against(trained, reference, tolerance=1e-5):
    diff = max_abs_diff(trained, reference)
    assert diff <= tolerance, diff
    return diff


def test_batchnorm_cnn_one_partition_equals_plain_torch(sc):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(120, 1, 8, 8)).astype(np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0).astype(np.int64) + (x[:, 0, 0, 0] > 1).astype(np.int64)
    torch.manual_seed(0)
    model = BatchNormCNN()
    trained, _ = run_engine(sc, model, (x,), y, torch.nn.CrossEntropyLoss(), sgd(), sizes=[120])
    reference = reference_train(model, x, y, torch.nn.CrossEntropyLoss(), sgd(),
                                BatchPlan([120], BATCH, SEED), ITERATIONS)
    check_against(trained, reference)
    assert int(trained.bn.num_batches_tracked) == ITERATIONS


def test_batchnorm_cnn_three_partitions_follows_the_buffer_rule(sc):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(120, 1, 8, 8)).astype(np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0).astype(np.int64)
    torch.manual_seed(0)
    model = BatchNormCNN()
    trained, _ = run_engine(sc, model, (x,), y, torch.nn.CrossEntropyLoss(), sgd())
    reference = partitioned_reference_train(model, (x,), y, torch.nn.CrossEntropyLoss(), sgd(),
                                            plan(), ITERATIONS, SEED)
    check_against(trained, reference)
    assert int(trained.bn.num_batches_tracked) == ITERATIONS     # identical in every task


def test_recommender_with_int64_ids_and_dense_features(sc):
    rng = np.random.default_rng(3)
    ids = np.stack([rng.integers(0, 20, 120), rng.integers(0, 30, 120),
                    rng.integers(0, 30, 120)], axis=1).astype(np.int64)
    dense = rng.normal(size=(120, 3)).astype(np.float32)
    y = ((ids[:, 0] % 2) ^ (ids[:, 1] % 2)).astype(np.int64)
    torch.manual_seed(0)
    model = Recommender()
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.02)      # noqa: E731
    trained, _ = run_engine(sc, model, (ids, dense), y, torch.nn.CrossEntropyLoss(), adam)
    reference = reference_train(model, (ids, dense), y, torch.nn.CrossEntropyLoss(), adam,
                                plan(), ITERATIONS)
    check_against(trained, reference)


def test_transformer_encoder_with_padding_mask_dropout_and_positional_buffer(sc):
    t, y = tokens(120, 6, 16, seed=4)
    y = y % 2
    lengths = np.random.default_rng(5).integers(2, 7, 120)
    padding = (np.arange(6)[None, :] >= lengths[:, None]).astype(np.int64)
    t[padding == 1] = 0
    torch.manual_seed(0)
    model = TinyTransformer()
    position = model.position.clone()
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=0.01)    # noqa: E731
    trained, _ = run_engine(sc, model, (t, padding), y, torch.nn.CrossEntropyLoss(), adamw)
    reference = partitioned_reference_train(model, (t, padding), y, torch.nn.CrossEntropyLoss(),
                                            adamw, plan(), ITERATIONS, SEED)
    check_against(trained, reference)
    assert torch.equal(trained.position, position)       # the constant buffer: bit for bit


def test_gru_sequence_classifier(sc):
    t, y = tokens(120, 5, 16, seed=6)
    torch.manual_seed(0)
    model = GRUClassifier()
    trained, _ = run_engine(sc, model, (t,), y, torch.nn.CrossEntropyLoss(), sgd(0.2))
    reference = reference_train(model, t, y, torch.nn.CrossEntropyLoss(), sgd(0.2), plan(),
                                ITERATIONS)
    check_against(trained, reference)


def test_unused_branch_under_adamw_weight_decay_stays_untouched(sc):
    x, y = classification(120, seed=7)
    torch.manual_seed(0)
    model = UnusedBranch()
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1)  # noqa: E731
    trained, opt = run_engine(sc, model, (x,), y, torch.nn.CrossEntropyLoss(), adamw)
    reference = reference_train(model, x, y, torch.nn.CrossEntropyLoss(), adamw, plan(),
                                ITERATIONS)
    check_against(trained, reference)
    assert torch.equal(trained.unused.weight, model.unused.weight)   # no decay, no moments
    assert trained.unused.weight.grad is None
    assert not opt.optimizer.state.get(trained.unused.weight)


def test_dict_output_model_with_a_criterion_reading_logits(sc):
    x, y = classification(120, seed=8)
    torch.manual_seed(0)
    model = DictOutput()
    trained, opt = run_engine(sc, model, (x,), y, LogitsLoss(), sgd())
    reference = reference_train(model, x, y, LogitsLoss(), sgd(), plan(), ITERATIONS)
    check_against(trained, reference)


def test_dict_output_validation_reads_its_logits_or_select(sc):
    """Metrics read a dict-like output (a Hugging Face ModelOutput) at its "logits"; select=
    picks anything else, and an output without "logits" names select= in its error."""
    from sparkdl.triggers import SeveralIteration

    x, y = classification(60, seed=8)
    torch.manual_seed(0)
    net = DictOutput()
    rdd = make_rdd(sc, list(zip(x, y)), [30, 30])
    opt = DistriOptimizer(net, rdd, LogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                          batch_size=20, end_trigger=MaxIteration(3), progress_bar=False)
    opt.set_validation(rdd, SeveralIteration(3), [Top1Accuracy()])
    opt.optimize()
    with torch.no_grad():
        logits = net(torch.from_numpy(x))["logits"]
    assert opt.summary.validations[-1].metrics["Top1Accuracy"] == pytest.approx(
        (logits.argmax(1).numpy() == y).mean())
    hidden = {"hidden": torch.tensor([[0.0, 2.0], [3.0, 1.0]])}
    with pytest.raises(TypeError, match=r"select="):
        Top1Accuracy().partial(hidden, torch.tensor([1, 0]), None)
    assert list(Top1Accuracy(select=lambda out: out["hidden"]).partial(
        hidden, torch.tensor([1, 1]), None)) == [1.0, 2.0]


def test_float64_model(sc):
    x, y = classification(120, seed=9)
    torch.manual_seed(0)
    model = SmallNet().double()
    trained, opt = run_engine(sc, model, (x.astype(np.float64),), y,
                              torch.nn.CrossEntropyLoss(), sgd())
    reference = reference_train(model, x.astype(np.float64), y, torch.nn.CrossEntropyLoss(),
                                sgd(), plan(), ITERATIONS)
    assert trained.fc1.weight.dtype == torch.float64
    check_against(trained, reference, 1e-12)


def test_lbfgs_closure_optimizer(sc):
    # L-BFGS as it is meant to be used: full batch, strong Wolfe line search, on a convex
    # problem (softmax regression, noisy labels). On a non-convex net with mini-batches its
    # curvature pairs amplify float rounding without bound, for single-process runs as well.
    rng = np.random.default_rng(10)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(6, 3)) + 2.0 * rng.normal(size=(120, 3)), 1)
    y = y.astype(np.int64)
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    lbfgs = lambda m: torch.optim.LBFGS(m.parameters(), lr=1, max_iter=5,  # noqa: E731
                                        history_size=10, line_search_fn="strong_wolfe")
    net = copy.deepcopy(model)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          lbfgs(net), batch_size=120, end_trigger=MaxIteration(ITERATIONS),
                          seed=SEED, progress_bar=False)
    opt.optimize()
    reference = copy.deepcopy(model)
    optimizer = lbfgs(reference)
    for _ in range(ITERATIONS):
        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            loss.backward()
            return loss

        optimizer.step(closure)
    check_against(net, reference)
    assert opt.summary.iterations[-1].loss < 0.7 * opt.summary.iterations[0].loss


def test_300_adam_iterations_stay_close_to_single_process(sc):
    x, y = classification(150, d=6, seed=11)
    sizes = [70, 25, 55]
    torch.manual_seed(0)
    model = SmallNet(hidden=16)
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.01)      # noqa: E731
    net = copy.deepcopy(model)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), torch.nn.CrossEntropyLoss(),
                          adam(net), batch_size=32, end_trigger=MaxIteration(300), seed=SEED,
                          progress_bar=False)
    opt.optimize()
    reference = reference_train(model, x, y, torch.nn.CrossEntropyLoss(), adam,
                                BatchPlan(sizes, 32, SEED), 300)
    diff = max_abs_diff(net, reference)
    print(f"300 Adam iterations: max abs difference {diff:.3g}")
    assert diff <= 1e-4


def test_int64_counter_is_exact_and_a_constant_buffer_is_unchanged(sc):
    x, y = classification(120, seed=12)
    torch.manual_seed(0)
    model = CounterNet()
    scale = model.scale.clone()
    trained, _ = run_engine(sc, model, (x,), y, torch.nn.CrossEntropyLoss(), sgd(),
                            iterations=10)
    assert int(trained.calls) == 2 ** 40 + 7 + 10
    assert torch.equal(trained.scale, scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_parameters_train_and_keep_integer_buffers_exact(sc, dtype):
    x, y = classification(120, seed=13)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3)).to(dtype)
    model[1].num_batches_tracked.fill_(2050)            # float16 holds 2050, not 2051
    trained, opt = run_engine(sc, model, (x,), y, torch.nn.CrossEntropyLoss(), sgd(0.05),
                              iterations=6)
    assert int(trained[1].num_batches_tracked) == 2056
    assert trained[0].weight.dtype == dtype
    reference = partitioned_reference_train(model, (x,), y, torch.nn.CrossEntropyLoss(),
                                            sgd(0.05), plan(), 6, SEED, input_dtype=dtype)
    # Gradients are summed in float32 and cast once; the reference sums them in 16 bits: the
    # weights may differ by a rounding step of the 16-bit format, not more.
    eps = torch.finfo(dtype).eps
    for a, b in zip(trained.parameters(), reference.parameters()):
        assert torch.allclose(a.float(), b.float(), rtol=4 * eps, atol=4 * eps)


def test_changing_requires_grad_before_optimize_is_honoured(sc):
    x, y = classification(120, seed=14)
    torch.manual_seed(0)
    model = SmallNet()
    net = copy.deepcopy(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          optimizer, batch_size=BATCH, end_trigger=MaxIteration(5), seed=SEED,
                          progress_bar=False)
    net.fc1.weight.requires_grad_(False)              # after construction
    opt.optimize()
    assert torch.equal(net.fc1.weight, model.fc1.weight)
    model.fc1.weight.requires_grad_(False)
    reference = reference_train(model, x, y, torch.nn.CrossEntropyLoss(),
                                lambda m: torch.optim.SGD(m.parameters(), lr=0.1), plan(), 5)
    check_against(net, reference)


def test_a_mixed_dtype_model_is_refused_clearly(sc):
    net = SmallNet()
    net.fc2.double()
    with pytest.raises(InvalidArgumentError, match=r"share one dtype among float64, float32, "
                                                   r"bfloat16 and float16"):
        DistriOptimizer(net, make_rdd(sc, [(np.zeros(6), 0)], [1]), torch.nn.CrossEntropyLoss(),
                        torch.optim.SGD(net.parameters(), lr=0.1), batch_size=1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_estimators_fit_and_transform_a_non_float32_model(spark, dtype):
    from sparkdl import NNEstimator

    rng = np.random.default_rng(15)
    x = rng.normal(size=(64, 4))
    df = spark.createDataFrame([(row.tolist(), float(row.sum())) for row in x],
                               ["features", "label"])
    est = NNEstimator(model=lambda: torch.nn.Sequential(torch.nn.Linear(4, 1),
                                                        torch.nn.Flatten(0)).to(dtype),
                      criterion=torch.nn.MSELoss(), batchSize=16, maxEpoch=2, seed=1,
                      learningRate=0.05, progressBar=False)
    model = est.fit(df)
    assert model.module[0].weight.dtype == dtype
    rows = model.transform(df).select("label", "prediction").collect()
    with torch.no_grad():
        expected = model.module(torch.from_numpy(x).to(dtype)).double().numpy()
    assert np.allclose([r.prediction for r in rows], expected, rtol=1e-6, atol=1e-6)
