"""Initial weights do not depend on other threads or on the caller's random state (issue: real
models; CrossValidator fits estimators on parallel threads)."""

from __future__ import annotations

import threading
import time

import torch

from sparkdl.engine.fit.optim.rng_isolation import private_torch_rng


def slow_factory():
    first = torch.nn.Linear(4, 3)
    time.sleep(0.02)                   # let another thread run between two draws
    return torch.nn.Sequential(first, torch.nn.Linear(3, 2))


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_parallel_seeded_builds_equal_sequential_ones():
    expected = {}
    for seed in (1, 2, 3, 4):
        torch.manual_seed(seed)
        expected[seed] = weights(slow_factory())
    got = {}

    def build(seed):
        with private_torch_rng(seed):
            got[seed] = weights(slow_factory())

    threads = [threading.Thread(target=build, args=(s,)) for s in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(got[s], expected[s]) for s in expected)


def test_the_callers_random_state_is_untouched():
    torch.manual_seed(99)
    before = torch.get_rng_state()
    with private_torch_rng(7):
        torch.rand(10)
    assert torch.equal(torch.get_rng_state(), before)


def test_estimator_initial_weights_ignore_the_global_state(spark):
    from sparkdl import NNClassifier

    df = spark.createDataFrame([([float(i % 3), 1.0, 0.5, -1.0], i % 3) for i in range(30)],
                               ["features", "label"])
    fits = []
    for global_seed in (123, 999):
        torch.manual_seed(global_seed)
        clf = NNClassifier(model=lambda: torch.nn.Linear(4, 3),
                           criterion=torch.nn.CrossEntropyLoss(), batchSize=10, maxEpoch=1,
                           seed=5, progressBar=False)
        fits.append(clf.fit(df).state_dict())
    assert all(torch.equal(fits[0][k], fits[1][k]) for k in fits[0])
