"""Augmentation in the tasks (issue: the DataFrame API for real data): ``train_transform``
(engine) and ``augment`` (estimators) run on every training batch with a generator seeded by
(seed, iteration, partition): equal to single-process PyTorch applying the same function to the
same shares, bitwise reproducible, never applied to validation or transform."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from df_helpers import mlp4, vector_df
from models import SmallNet, bitwise_equal, classification_data, make_rdd, max_abs_diff
from sparkdl import BatchPlan, DistriOptimizer, NNClassifier
from sparkdl.data.batch_plan import transform_generator
from sparkdl.triggers import MaxIteration

SIZES, BATCH, SEED, ITERATIONS = [50, 30, 40], 24, 4, 8


def jitter(x, rng):
    """Gaussian noise and a random sign flip per row: depends on the generator's draws."""
    signs = rng.choice(np.array([-1.0, 1.0], dtype=x.dtype), size=(len(x), 1))
    return (x + rng.normal(scale=0.3, size=x.shape).astype(x.dtype)) * signs


def engine_run(sc, x, y, seed=SEED, transform=jitter):
    torch.manual_seed(0)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=BATCH,
                          end_trigger=MaxIteration(ITERATIONS), seed=seed, progress_bar=False,
                          train_transform=transform)
    return opt.optimize()


def reference(x, y):
    torch.manual_seed(0)
    net = copy.deepcopy(SmallNet())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    for t in range(ITERATIONS):
        epoch, step = plan.epoch_and_step(t)
        xs, ys = [], []
        for p in range(len(SIZES)):
            idx = plan.offsets[p] + plan.local_indices(epoch, step, p)
            if len(idx):
                xs.append(jitter(x[idx], transform_generator(SEED, t, p)))
                ys.append(y[idx])
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.from_numpy(np.concatenate(xs))),
                                          torch.from_numpy(np.concatenate(ys))).backward()
        optimizer.step()
    return net


def test_train_transform_equals_single_process_with_the_same_draws(sc):
    x, y = classification_data(sum(SIZES), seed=3)
    trained = engine_run(sc, x, y)
    assert max_abs_diff(trained, reference(x, y)) < 1e-6
    # and the augmentation mattered: without it the weights are elsewhere
    assert max_abs_diff(engine_run(sc, x, y, transform=None), trained) > 1e-3


def test_train_transform_is_reproducible_and_follows_the_seed(sc):
    x, y = classification_data(sum(SIZES), seed=3)
    first, second = engine_run(sc, x, y), engine_run(sc, x, y)
    assert bitwise_equal(first, second)
    assert not bitwise_equal(first, engine_run(sc, x, y, seed=SEED + 1, transform=jitter))


def test_a_train_transform_that_drops_rows_is_a_clear_error(sc):
    x, y = classification_data(sum(SIZES), seed=3)
    with pytest.raises(Exception, match="train_transform must return an array with"):
        engine_run(sc, x, y, transform=lambda b, rng: b[:1])


def _augmented_classifier(seed, augment):
    return NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), augment=augment,
                        maxEpoch=2, batchSize=32, seed=seed, numTrainWorkers=2,
                        optimizer="sgd", learningRate=0.05, progressBar=False)


def test_estimator_augment_is_seeded_and_never_touches_transform(spark):
    df = vector_df(spark, 160)
    a = _augmented_classifier(7, jitter).fit(df)
    b = _augmented_classifier(7, jitter).fit(df)
    c = _augmented_classifier(8, jitter).fit(df)
    assert bitwise_equal(a.module, b.module)
    assert not bitwise_equal(a.module, c.module)
    # the same seed without augment trains other weights: augment was applied
    assert not bitwise_equal(a.module, _augmented_classifier(7, None).fit(df).module)
    rows = a.transform(df).select("features", "rawPrediction").toPandas()
    x = np.stack([v.toArray() for v in rows["features"]]).astype(np.float32)
    with torch.no_grad():
        direct = a.module(torch.from_numpy(x)).double().numpy()
    np.testing.assert_allclose(np.stack([v.toArray() for v in rows["rawPrediction"]]), direct,
                               rtol=1e-6, atol=1e-7)
