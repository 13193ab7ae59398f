"""The engine's training features through the estimators (issue: the DataFrame API for real
data): ``lrScheduler``, ``gradientClipNorm``, ``earlyStoppingPatience``/``restoreBest``,
``validationMetrics``, ``initialModel`` and ``checkpointDir``, each against single-process
PyTorch on the same union batches (or against an uninterrupted fit)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models import bitwise_equal, kill_driver_after_first_checkpoint, max_abs_diff
from sparkdl import BatchPlan, InvalidArgumentError, NNClassifier, NNEstimator

BATCH, SEED = 16, 5


def regression_frame(spark, n=96, val_every=0, seed=0):
    """One partition, rows in order: what the estimator trains on is ``x[~val], y[~val]`` in
    this order, so a single-process reference can use the same batches."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.5]) + 0.1 * rng.normal(size=n)).astype(np.float32)
    val = np.zeros(n, bool) if not val_every else (np.arange(n) % val_every == 0)
    if val_every:   # validation targets unrelated to x: the validation loss soon rises
        y[val] = rng.normal(scale=3.0, size=int(val.sum())).astype(np.float32)
    df = spark.createDataFrame([(r.tolist(), float(t), bool(v)) for r, t, v in zip(x, y, val)],
                               ["features", "y", "isVal"]).coalesce(1)
    return df, x, y, val


def net_and_copy():
    torch.manual_seed(11)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1),
                              torch.nn.Flatten(0))
    return net, copy.deepcopy(net)


def estimator(net, **params):
    base = dict(model=net, criterion=torch.nn.MSELoss(), labelCol="y", batchSize=BATCH,
                seed=SEED, numTrainWorkers=1, progressBar=False,
                optimizerFactory=lambda p: torch.optim.SGD(p, lr=0.05))
    base.update(params)
    return NNEstimator(**base)


def reference_epochs(net, x, y, epochs, clip=None, scheduler=None, lr=0.05):
    """Plain PyTorch, epoch by epoch; yields the model after each epoch."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    sched = scheduler(optimizer) if scheduler else None
    plan = BatchPlan([len(y)], BATCH, SEED, True)
    for epoch in range(epochs):
        for step in range(plan.iterations_per_epoch):
            idx = plan.global_indices(epoch, step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(torch.from_numpy(x[idx])),
                                         torch.from_numpy(y[idx])).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            optimizer.step()
        if sched:
            sched.step()
        yield net


def test_lr_scheduler_and_gradient_clipping_match_single_process(spark):
    df, x, y, _ = regression_frame(spark)
    make_sched = lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)  # noqa: E731
    net, ref = net_and_copy()
    fitted = estimator(net, maxEpoch=3, gradientClipNorm=0.5, lrScheduler=make_sched,
                       optimizerFactory=lambda p: torch.optim.SGD(p, lr=0.2)).fit(df)
    for _ in reference_epochs(ref, x, y, 3, clip=0.5, scheduler=make_sched, lr=0.2):
        pass
    assert max_abs_diff(fitted.module, ref) < 1e-6
    net2, _ = net_and_copy()
    unclipped = estimator(net2, maxEpoch=3, lrScheduler=make_sched,
                          optimizerFactory=lambda p: torch.optim.SGD(p, lr=0.2)).fit(df)
    assert max_abs_diff(unclipped.module, fitted.module) > 1e-3   # clipping mattered


def test_early_stopping_restores_the_best_epoch_like_single_process(spark):
    df, x, y, val = regression_frame(spark, n=120, val_every=3)
    net, ref = net_and_copy()
    fitted = estimator(net, maxEpoch=30, earlyStoppingPatience=2,
                       validationIndicatorCol="isVal").fit(df)
    # single process: validation loss after every epoch, stop after 2 without improvement
    xt, yt = x[~val], y[~val]
    xv, yv = torch.from_numpy(x[val]), torch.from_numpy(y[val])
    best, best_state, waited, epochs = None, None, 0, 0
    for model in reference_epochs(ref, xt, yt, 30):
        epochs += 1
        with torch.no_grad():
            loss = float(torch.nn.functional.mse_loss(model(xv), yv))
        if best is None or loss < best:
            best, best_state, waited = loss, copy.deepcopy(model.state_dict()), 0
        else:
            waited += 1
            if waited == 2:
                break
    assert epochs < 30, "the reference never stopped early: the test proves nothing"
    assert len(fitted.summary) == epochs
    np.testing.assert_allclose(fitted.summary["validation_Loss"].min(), best, rtol=1e-5)
    ref.load_state_dict(best_state)
    assert max_abs_diff(fitted.module, ref) < 1e-6


def test_validation_metrics_by_name(spark):
    df, *_ = regression_frame(spark, val_every=4)
    net, _ = net_and_copy()
    fitted = estimator(net, maxEpoch=1, validationIndicatorCol="isVal",
                       validationMetrics=["mae", "loss"]).fit(df)
    assert {"validation_Loss", "validation_MAE"} <= set(fitted.summary.columns)


def test_initial_model_warm_starts_from_a_fitted_model(spark):
    df, x, y, _ = regression_frame(spark)
    net, ref = net_and_copy()
    first = estimator(net, maxEpoch=1).fit(df)
    other, _ = net_and_copy()
    torch.nn.init.zeros_(other[0].weight)          # its own initialisation is not used
    second = estimator(other, maxEpoch=1, initialModel=first).fit(df)
    # one more epoch from first's weights, with a fresh optimizer, on epoch 0's batches
    start = copy.deepcopy(ref)
    start.load_state_dict(first.module.state_dict())
    for _ in reference_epochs(start, x, y, 1):
        pass
    assert max_abs_diff(second.module, start) < 1e-6
    with pytest.raises(InvalidArgumentError, match="initialModel of NNEstimator does not fit"):
        estimator(torch.nn.Linear(3, 1), maxEpoch=1, initialModel=first).fit(df)


def test_checkpoint_dir_resumes_to_the_uninterrupted_result(spark, tmp_path):
    df, *_ = regression_frame(spark)
    net, _ = net_and_copy()
    whole = estimator(net, maxEpoch=4).fit(df)
    ckpt = str(tmp_path / "ckpt")
    net_a, _ = net_and_copy()
    estimator(net_a, maxEpoch=2, checkpointDir=ckpt).fit(df)      # stops after 2 epochs
    net_b, _ = net_and_copy()
    resumed = estimator(net_b, maxEpoch=4, checkpointDir=ckpt).fit(df)
    assert bitwise_equal(resumed.module, whole.module)


def test_early_stopping_needs_validation_rows(spark):
    df, *_ = regression_frame(spark)
    net, _ = net_and_copy()
    with pytest.raises(InvalidArgumentError, match="The 'earlyStoppingPatience' Param of "
                                                   "NNEstimator must be 0 unless "
                                                   "validationIndicatorCol"):
        estimator(net, earlyStoppingPatience=2).fit(df)


def test_classifier_defaults_to_loss_and_accuracy(spark):
    from df_helpers import mlp4, vector_df

    model = NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), maxEpoch=1,
                         validationIndicatorCol="isVal", progressBar=False).fit(vector_df(spark))
    assert {"validation_Loss", "validation_Top1Accuracy"} <= set(model.summary.columns)


def test_weight_col_gives_the_weighted_mean_loss_of_single_process(spark):
    """weightCol: every step minimises sum(w_i * loss_i) / sum(w_i) over the union batch."""
    _, x, y, _ = regression_frame(spark)
    weights = (np.arange(len(y)) % 4).astype(np.float32)          # some rows weigh 0
    df = spark.createDataFrame([(r.tolist(), float(t), float(w)) for r, t, w in
                                zip(x, y, weights)], ["features", "y", "w"]).coalesce(1)
    net, ref = net_and_copy()
    fitted = estimator(net, maxEpoch=2, weightCol="w").fit(df)
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.05)
    plan = BatchPlan([len(y)], BATCH, SEED, True)
    for t in range(2 * plan.iterations_per_epoch):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        optimizer.zero_grad()
        per = torch.nn.functional.mse_loss(ref(torch.from_numpy(x[idx])),
                                           torch.from_numpy(y[idx]), reduction="none")
        w = torch.from_numpy(weights[idx])
        ((per * w).sum() / w.sum()).backward()
        optimizer.step()
    assert max_abs_diff(fitted.module, ref) < 1e-5
    net2, _ = net_and_copy()
    unweighted = estimator(net2, maxEpoch=2).fit(df)
    assert max_abs_diff(unweighted.module, fitted.module) > 1e-3      # the weights mattered


def test_weight_col_must_be_numeric_and_not_negative(spark):
    df, *_ = regression_frame(spark, n=40)
    net, _ = net_and_copy()
    with pytest.raises(InvalidArgumentError, match=r"Column 'nope' \(weightCol\) does not exist"):
        estimator(net, maxEpoch=1, weightCol="nope").fit(df)
    from pyspark.sql import functions as F

    negative = df.withColumn("w", F.lit(-1.0))
    with pytest.raises(Exception, match=r"Column 'w' \(weightCol\) must hold finite weights"):
        estimator(net, maxEpoch=1, weightCol="w").fit(negative)


@pytest.mark.cluster
def test_killed_driver_resumes_an_estimator_fit_from_checkpoint_dir(spark, tmp_path):
    """Acceptance 5: a driver fitting with checkpointDir is SIGKILLed after a checkpoint; the
    same fit started again resumes and ends bitwise equal to an uninterrupted fit."""
    import os
    import subprocess
    import sys

    import estimator_job

    here = os.path.dirname(os.path.abspath(__file__))
    ckpt, out = tmp_path / "ckpt", tmp_path / "weights.pt"
    cmd = [sys.executable, os.path.join(here, "estimator_job.py"), "local[2]", str(out),
           str(ckpt), "--epochs", "4"]
    kill_driver_after_first_checkpoint(cmd, ckpt)
    assert not out.exists()
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resum" in second.stderr.lower(), second.stderr[-2000:]
    resumed = estimator_job.model()
    resumed.load_state_dict(torch.load(out, weights_only=True))
    whole = estimator_job.fit(spark, 4)
    assert bitwise_equal(resumed, whole.module)
