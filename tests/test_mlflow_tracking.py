"""MLflow: runs, metrics and models, against a real local tracking store (sqlite)."""

from __future__ import annotations

import json
import logging
import socket
import sys

import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler

from df_helpers import blobs, mlp4, vector_df
from sparkdl import (DistriOptimizer, InvalidArgumentError, Loss, NNClassifier, NNEstimator,
                     Top1Accuracy)
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.engine.fit.reports.mlflow_tracking import SUMMARY_ARTIFACT
from sparkdl.ml.mlflow_models import log_pytorch_model
from sparkdl.ml.mlflow_runs import check_logging
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import EveryEpoch, MaxEpoch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite tracking store for the module (creating one takes seconds)."""
    root = tmp_path_factory.mktemp("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlflow.db")
    yield root
    mlflow.set_tracking_uri(previous)


@pytest.fixture
def client(store, request):
    """An experiment of its own for each test, its artifacts under the store's directory."""
    name = request.node.name
    experiment = mlflow.create_experiment(name, artifact_location=str(store / name))
    mlflow.set_experiment(experiment_id=experiment)
    yield MlflowClient()
    while mlflow.active_run() is not None:
        mlflow.end_run()


def classifier(**params):
    base = dict(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), batchSize=32, maxEpoch=2,
                learningRate=0.02, seed=0, progressBar=False)
    base.update(params)
    return NNClassifier(**base)


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def local_data(n=120, parts=2):
    x, y = blobs(n)
    records = list(zip(x.astype(np.float32), y))
    size = n // parts
    return LocalPartitions([records[i * size:(i + 1) * size] for i in range(parts)])


def engine(data, epochs=2):
    torch.manual_seed(0)
    net = mlp4()
    opt = DistriOptimizer(net, data, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                          batch_size=25, end_trigger=MaxEpoch(epochs), progress_bar=False)
    return opt.set_validation(data, EveryEpoch(), [Loss(), Top1Accuracy()])


def test_engine_logs_its_settings_every_iteration_and_validation_and_the_summary(client):
    data = local_data()
    opt = engine(data).set_mlflow(flush_interval_s=0.05)
    with mlflow.start_run() as run:
        opt.optimize()
    assert opt.mlflow_run_id == run.info.run_id
    logged = client.get_run(run.info.run_id)
    assert logged.data.params["batch_size"] == "25"
    assert logged.data.params["optimizer"] == "SGD"
    assert logged.data.params["optimizer.momentum"] == "0.9"
    assert logged.data.params["partitions"] == "2"
    iterations = opt.summary.iterations
    assert len(iterations) == 2 * 5
    assert history(client, run.info.run_id, "train/loss") == \
        [(r.iteration, r.loss) for r in iterations]
    assert history(client, run.info.run_id, "train/samples_per_s") == \
        [(r.iteration, r.samples_per_s) for r in iterations]
    for name in ("Loss", "Top1Accuracy"):
        assert history(client, run.info.run_id, f"validation/{name}") == \
            [(v.iteration, v.metrics[name]) for v in opt.summary.validations]
    summary = json.loads(mlflow.artifacts.load_text(
        f"{logged.info.artifact_uri}/{SUMMARY_ARTIFACT}"))
    assert summary["status"] == "FINISHED" and summary["iterations"] == 10
    assert summary["final_loss"] == iterations[-1].loss
    assert [v["metrics"] for v in summary["validations"]] == \
        [v.metrics for v in opt.summary.validations]
    # the training and validation shards (the same 120 samples): 4 float32 features and an
    # int64 label each
    assert summary["shard_bytes"] == opt.summary.shard_bytes == 2 * 120 * (4 * 4 + 8)
    assert (summary["replicas_built"], summary["executors_avoided"]) == (0, 0)


def test_engine_without_an_active_run_creates_and_ends_its_own(client):
    opt = engine(local_data(), epochs=1).set_mlflow(run_name="engine run")
    opt.optimize()
    run = client.get_run(opt.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "engine run"
    assert len(history(client, opt.mlflow_run_id, "train/loss")) == 5
    assert mlflow.active_run() is None


def test_set_mlflow_checks_its_arguments_and_that_mlflow_is_installed(monkeypatch):
    opt = engine(local_data(), epochs=1)
    with pytest.raises(InvalidArgumentError, match=r"'flush_interval_s' argument .* positive"):
        opt.set_mlflow(flush_interval_s=0)
    with pytest.raises(InvalidArgumentError, match=r"'run_id' argument .* non-empty string"):
        opt.set_mlflow(run_id="")
    with pytest.raises(InvalidArgumentError, match=r"'params' argument .* string keys"):
        opt.set_mlflow(params={1: "a"})
    monkeypatch.setitem(sys.modules, "mlflow", None)       # as if it were not installed
    with pytest.raises(InvalidArgumentError, match=r"pip install 'sparkdl-torch\[mlflow\]'"):
        opt.set_mlflow()
    with pytest.raises(InvalidArgumentError, match=r"NNClassifier \(mlflowLogging=True\) logs "
                                                   r"to MLflow, which is not installed"):
        check_logging(classifier(mlflowLogging=True))


def test_fit_logs_params_loss_per_iteration_and_validation_metrics_to_the_active_run(
        spark, client):
    df = vector_df(spark, 200)
    est = classifier(validationIndicatorCol="isVal", mlflowLogging=True)
    with mlflow.start_run() as run:
        model = est.fit(df)
    assert model.mlflow_run_id == run.info.run_id
    logged = client.get_run(run.info.run_id)
    params = logged.data.params
    assert params["batchSize"] == "32" and params["learningRate"] == "0.02"
    assert params["validationIndicatorCol"] == "isVal" and params["mlflowLogging"] == "true"
    assert params["model"] == "Sequential" and params["criterion"] == "CrossEntropyLoss"
    assert logged.data.tags["sparkdl.estimator"] == "NNClassifier"
    # one loss per iteration, steps 1..N; each epoch's records-weighted mean is the model's
    # per-epoch train_loss
    train_rows = df.filter("not isVal").count()
    plan = BatchPlan([train_rows], 32, 0)
    per_epoch = plan.iterations_per_epoch
    losses = history(client, run.info.run_id, "train/loss")
    assert [s for s, _ in losses] == list(range(1, 2 * per_epoch + 1))
    for epoch, row in model.summary.iterrows():
        part = losses[epoch * per_epoch:(epoch + 1) * per_epoch]
        sizes = [plan.batch_size_at(step) for step in range(per_epoch)]
        mean = sum(v * b for (_, v), b in zip(part, sizes)) / sum(sizes)
        assert mean == pytest.approx(row["train_loss"], rel=1e-12)
    for name in ("Loss", "Top1Accuracy"):
        assert history(client, run.info.run_id, f"validation/{name}") == \
            [(per_epoch * (e + 1), v)
             for e, v in enumerate(model.summary[f"validation_{name}"])]
    assert len(history(client, run.info.run_id, "train/samples_per_s")) == 2 * per_epoch
    assert [a.path for a in client.list_artifacts(run.info.run_id, "sparkdl")] == \
        [SUMMARY_ARTIFACT]


def test_fit_without_mlflow_logging_logs_nothing(spark, client):
    with mlflow.start_run() as run:
        model = classifier(maxEpoch=1).fit(vector_df(spark, 60))
    assert model.mlflow_run_id is None
    assert client.get_run(run.info.run_id).data.metrics == {}


def test_mlflow_spark_round_trip_of_a_pipeline_with_sparkdl_stages(spark, client):
    df = vector_df(spark, 120)
    regressor = NNEstimator(model=lambda: torch.nn.Sequential(torch.nn.Linear(4, 1),
                                                              torch.nn.Flatten(0)),
                            criterion=torch.nn.MSELoss(), featuresCol="scaled",
                            labelCol="label", predictionCol="score", batchSize=32, maxEpoch=1,
                            progressBar=False)
    pipeline = Pipeline(stages=[StandardScaler(inputCol="features", outputCol="scaled"),
                                regressor, classifier(featuresCol="scaled", maxEpoch=1)])
    fitted = pipeline.fit(df)
    with mlflow.start_run():
        info = mlflow.spark.log_model(fitted, "pipeline", pip_requirements=["sparkdl-torch"])
    loaded = mlflow.spark.load_model(info.model_uri)
    assert isinstance(loaded, PipelineModel)
    assert [type(s).__name__ for s in loaded.stages] == \
        ["StandardScalerModel", "NNModel", "NNClassifierModel"]
    columns = ["score", "rawPrediction", "probability", "prediction"]
    assert loaded.transform(df).select(columns).collect() == \
        fitted.transform(df).select(columns).collect()


def test_log_pytorch_model_with_an_example_and_signature_from_the_training_rows(spark,
                                                                              client):
    model = classifier(maxEpoch=1).fit(vector_df(spark, 60))
    with mlflow.start_run():
        info = log_pytorch_model(model, pip_requirements=["torch"])
    stored = mlflow.models.get_model_info(info.model_uri)
    inputs, outputs = stored.signature.inputs.inputs, stored.signature.outputs.inputs
    assert [(s.type, s.shape) for s in inputs] == [(np.dtype("float32"), (-1, 4))]
    assert [(s.type, s.shape) for s in outputs] == [(np.dtype("float32"), (-1, 3))]
    assert stored.metadata["sparkdl_input_columns"] == ["features"]
    example = model.training_example[0]
    assert example.dtype == np.float32 and example.shape[1:] == (4,) and len(example) > 1
    served = mlflow.pyfunc.load_model(info.model_uri).predict(example)
    with torch.no_grad():
        expected = model.module(torch.from_numpy(example)).numpy()
    np.testing.assert_array_equal(np.asarray(served), expected)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracking_server_that_refuses_connections_never_changes_or_stops_training(
        spark, store, caplog):
    df = vector_df(spark, 100)
    plain = classifier().fit(df)
    uri = f"http://127.0.0.1:{_closed_port()}"
    mlflow.set_tracking_uri(uri)
    try:
        with caplog.at_level(logging.WARNING, logger="sparkdl"):
            logged = classifier(mlflowLogging=True).fit(df)
    finally:
        mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    for name, value in plain.state_dict().items():
        assert torch.equal(value, logged.state_dict()[name]), name
    assert logged.mlflow_run_id is None
    warnings = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert len(warnings) == 1
    assert uri in warnings[0] and "ConnectionRefusedError" in warnings[0]
    assert "nothing was logged" in warnings[0] and "Training goes on" in warnings[0]


def test_cross_validator_in_parallel_logs_each_fit_to_its_own_child_run(spark, client):
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    df = vector_df(spark, 120)
    # a batch larger than any fold: one iteration per epoch, so an epoch's train_loss is the
    # loss logged at that step
    clf = classifier(batchSize=512, mlflowLogging=True)
    grid = ParamGridBuilder().addGrid(clf.learningRate, [0.01, 0.1]).build()
    cv = CrossValidator(estimator=clf, estimatorParamMaps=grid, numFolds=2, parallelism=2,
                        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
                        seed=1, collectSubModels=True)
    with mlflow.start_run() as parent:
        cv_model = cv.fit(df)
    children = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    sub_models = [m for fold in cv_model.subModels for m in fold]
    assert sorted(r.info.run_id for r in children) == \
        sorted(m.mlflow_run_id for m in sub_models)
    assert len(set(m.mlflow_run_id for m in sub_models)) == 4
    runs = {r.info.run_id: r for r in children}
    for sub in sub_models:
        run = runs[sub.mlflow_run_id]
        assert run.info.status == "FINISHED"
        assert float(run.data.params["learningRate"]) == sub.getLearningRate()
        assert json.loads(run.data.tags["sparkdl.param_map"]) == \
            {"learningRate": sub.getLearningRate()}
        assert_losses_are(client, run.info.run_id, sub)
    # the final refit of the best param map, on the caller's thread, goes to the parent run
    best = cv_model.bestModel
    assert best.mlflow_run_id == parent.info.run_id
    assert float(client.get_run(parent.info.run_id).data.params["learningRate"]) == \
        best.getLearningRate()
    assert_losses_are(client, parent.info.run_id, best)


def assert_losses_are(client, run_id, model):
    """Two epochs of one iteration each: the run's losses are the model's epoch losses
    (records-weighted means of one value: equal up to rounding)."""
    losses = history(client, run_id, "train/loss")
    assert [step for step, _ in losses] == [1, 2]
    assert [v for _, v in losses] == pytest.approx(list(model.summary["train_loss"]),
                                                   rel=1e-12)
