"""The DataFrame API: input forms, errors, persistence, Pipelines, CrossValidator, Adult."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler
from pyspark.sql import functions as F

from df_helpers import blobs, image_folder, mlp, mlp4, vector_df
from sparkdl import (InvalidArgumentError, ModelCriterionMismatchError, NNClassifier,
                     NNClassifierModel, NNEstimator, NNModel, TrainingDataError)


def classifier(**params):
    base = dict(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), batchSize=32, maxEpoch=3,
                learningRate=0.02, seed=0)
    base.update(params)
    return NNClassifier(**base)


def accuracy(df):
    return MulticlassClassificationEvaluator(metricName="accuracy").evaluate(df)


def collect(df, col):
    return [r[0] for r in df.select(col).collect()]


def test_classifier_outputs_work_with_spark_evaluators(spark):
    df = vector_df(spark)
    model = classifier(validationIndicatorCol="isVal").fit(df)
    out = model.transform(df)
    types = dict(out.dtypes)
    assert types["prediction"] == "double"
    assert types["probability"] == "vector" and types["rawPrediction"] == "vector"
    assert accuracy(out) > 0.8
    probs = np.array([v.toArray() for v in collect(out, "probability")])
    assert np.allclose(probs.sum(axis=1), 1.0)
    assert list(model.summary.columns) == ["epoch", "train_loss", "validation_Loss",
                                           "validation_Top1Accuracy", "iterations", "seconds"]
    assert list(model.summary["iterations"]) == [model.summary["iterations"][0]] * 3
    assert len(model.summary) == 3
    ax = model.plot_summary()
    assert len(ax.get_lines()) == 3
    assert [list(line.get_xdata()) for line in ax.get_lines()][0] == [1, 2, 3]


def test_output_column_set_to_empty_is_skipped(spark):
    model = classifier(maxEpoch=1).fit(vector_df(spark, 60))
    out = model.setProbabilityCol("").setRawPredictionCol("").transform(vector_df(spark, 60))
    assert "probability" not in out.columns and "rawPrediction" not in out.columns
    assert "prediction" in out.columns


@pytest.mark.parametrize("form", ["sparse-vector", "array", "columns", "shape"])
def test_every_feature_form_trains_and_predicts(spark, form):
    x, y = blobs(200)
    if form == "sparse-vector":
        df, extra = vector_df(spark, 200, sparse=True), {}
    elif form == "array":
        df = spark.createDataFrame([([float(v) for v in a], int(b)) for a, b in zip(x, y)],
                                   ["features", "label"])
        extra = {}
    elif form == "columns":
        df = spark.createDataFrame([(*map(float, a), int(b)) for a, b in zip(x, y)],
                                   ["a", "b", "c", "d", "label"])
        extra = {"featuresCols": ["a", "b", "c", "d"]}
    else:
        df = spark.createDataFrame([([float(v) for v in a], int(b)) for a, b in zip(x, y)],
                                   ["features", "label"])
        extra = {"featureShape": [2, 2],
                 "model": lambda: torch.nn.Sequential(torch.nn.Flatten(), mlp4())}
    model = classifier(**extra).fit(df)
    assert accuracy(model.transform(df)) > 0.7


def test_image_column(spark, tmp_path):
    labels = image_folder(str(tmp_path / "img"))
    images = spark.read.format("image").load(str(tmp_path / "img"))
    names = F.element_at(F.split(F.col("image.origin"), "/"), -1)
    mapping = F.create_map(*[F.lit(v) for kv in labels.items() for v in kv])
    df = images.withColumn("label", mapping[names])
    net = lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),  # noqa: E731
                                      torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2))
    model = classifier(model=net, featuresCol="image", maxEpoch=8, batchSize=10).fit(df)
    assert accuracy(model.transform(df)) >= 0.9


def test_regression_with_scalar_and_array_labels(spark):
    x, _ = blobs(200)
    df = spark.createDataFrame([([float(v) for v in a], float(a.sum()), [float(a[0]), float(a[1])])
                                for a in x], ["features", "y", "y2"])
    one = NNEstimator(model=lambda: torch.nn.Linear(4, 1), criterion=torch.nn.MSELoss(),
                      labelCol="y", batchSize=20, maxEpoch=10, learningRate=0.05,
                      featureShape=[4])
    # a Linear(4, 1) outputs (n, 1): the scalar label must be shaped alike
    with pytest.raises(ModelCriterionMismatchError, match=r"same shape"):
        one.fit(df)
    squeeze = NNEstimator(model=lambda: torch.nn.Sequential(torch.nn.Linear(4, 1),
                                                            torch.nn.Flatten(0)),
                          criterion=torch.nn.MSELoss(), labelCol="y", batchSize=20, maxEpoch=10,
                          learningRate=0.05)
    fitted = squeeze.fit(df)
    out = fitted.transform(df)
    assert dict(out.dtypes)["prediction"] == "double"
    pred = np.array(collect(out, "prediction"))
    assert np.abs(pred - x.sum(axis=1)).mean() < 0.2
    two = NNEstimator(model=lambda: torch.nn.Linear(4, 2), criterion=torch.nn.MSELoss(),
                      labelCol="y2", batchSize=20, maxEpoch=10, learningRate=0.05).fit(df)
    out2 = two.transform(df)
    assert dict(out2.dtypes)["prediction"] == "array<double>"
    assert np.abs(np.array(collect(out2, "prediction")) - x[:, :2]).mean() < 0.2


def test_preprocessing_function_runs_on_feature_batches(spark):
    df = vector_df(spark, 100)
    flip = classifier(preprocess=lambda a: -a, maxEpoch=4).fit(df)
    plain = classifier(maxEpoch=4).fit(df)
    assert accuracy(flip.transform(df)) > 0.7
    assert collect(flip.transform(df), "rawPrediction") != collect(plain.transform(df),
                                                                   "rawPrediction")


@pytest.mark.parametrize("change,error,match", [
    (lambda df: df.withColumn("features", F.lit("x")), InvalidArgumentError,
     r"Column 'features' \(featuresCol\) has type string.*VectorAssembler"),
    (lambda df: df.drop("label"), InvalidArgumentError,
     r"Column 'label' \(labelCol\) does not exist"),
    (lambda df: df.withColumnRenamed("features", "f"), InvalidArgumentError,
     r"Column 'features' \(featuresCol\) does not exist"),
    (lambda df: df.withColumn("label", F.when(F.rand(1) < 0.05, 5).otherwise(F.col("label"))),
     TrainingDataError, r"class indices in 0\.\.2.*labels: column 'label'"),
    (lambda df: df.withColumn("label", F.col("label") - 1), TrainingDataError,
     r"Column 'label' \(labelCol\) must hold 0-based class indices"),
])
def test_bad_dataframes_get_errors_naming_the_column(spark, change, error, match):
    with pytest.raises(error, match=match):
        classifier(maxEpoch=1).fit(change(vector_df(spark, 80)))


def test_nan_features_name_the_column(spark):
    df = spark.createDataFrame([([1.0, float("nan"), 0.0, 1.0], 0), ([1.0, 2.0, 0.0, 1.0], 1)],
                               ["features", "label"])
    with pytest.raises(TrainingDataError, match=r"Column 'features' has NaN or infinite values"):
        classifier(maxEpoch=1).fit(df)


def test_feature_size_that_does_not_fit_the_model(spark):
    df = vector_df(spark, 40)
    with pytest.raises(ModelCriterionMismatchError, match=r"cannot run on the training features"
                                                          r".*\(4, 4\).*features: column "
                                                          r"'features'"):
        classifier(model=lambda: mlp(7, 3), maxEpoch=1).fit(df)


def test_save_load_gives_bitwise_identical_predictions(spark, tmp_path):
    df = vector_df(spark, 120)
    model = classifier().fit(df)
    model.write().overwrite().save(str(tmp_path / "model"))
    loaded = NNClassifierModel.load(str(tmp_path / "model"))
    assert loaded.uid == model.uid and loaded.getBatchSize() == 32
    assert collect(loaded.transform(df), "rawPrediction") == \
        collect(model.transform(df), "rawPrediction")
    weights = torch.load(str(tmp_path / "model" / "weights.pt"), weights_only=True)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    with pytest.raises(InvalidArgumentError, match=r"holds a sparkdl\.ml\.estimators\."
                                                   r"NNClassifierModel, not a "
                                                   r"sparkdl\.ml\.estimators\.NNModel"):
        NNModel.load(str(tmp_path / "model"))


def test_pipelines_save_and_load_fitted_and_unfitted(spark, tmp_path):
    df = vector_df(spark, 120)
    scaler = StandardScaler(inputCol="features", outputCol="scaled")
    pipeline = Pipeline(stages=[scaler, classifier(featuresCol="scaled")])
    fitted = pipeline.fit(df)
    fitted.write().overwrite().save(str(tmp_path / "fitted"))
    reloaded = PipelineModel.load(str(tmp_path / "fitted"))
    assert collect(reloaded.transform(df), "probability") == \
        collect(fitted.transform(df), "probability")
    pipeline.write().overwrite().save(str(tmp_path / "unfitted"))
    refit = Pipeline.load(str(tmp_path / "unfitted")).fit(df)
    assert collect(refit.transform(df), "probability") == \
        collect(fitted.transform(df), "probability")


def test_cross_validator_picks_a_model_and_saves(spark, tmp_path):
    from pyspark.ml.tuning import CrossValidator, CrossValidatorModel, ParamGridBuilder

    df = vector_df(spark, 160)
    clf = classifier(maxEpoch=2)
    grid = (ParamGridBuilder().addGrid(clf.learningRate, [1e-4, 0.05])
            .addGrid(clf.batchSize, [16, 64]).build())
    cv = CrossValidator(estimator=clf, estimatorParamMaps=grid, numFolds=2, parallelism=2,
                        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
                        seed=1)
    cv_model = cv.fit(df)
    best = int(np.argmax(cv_model.avgMetrics))
    assert grid[best][clf.learningRate] == 0.05
    assert cv_model.bestModel.getLearningRate() == 0.05
    cv_model.write().overwrite().save(str(tmp_path / "cv"))
    loaded = CrossValidatorModel.load(str(tmp_path / "cv"))
    assert collect(loaded.transform(df), "prediction") == \
        collect(cv_model.transform(df), "prediction")


def test_module_is_copied_never_mutated_and_optimizer_factory_is_used(spark):
    torch.manual_seed(0)
    net = mlp4()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    used = []

    def factory(params, lr):          # learningRate reaches the factory as lr
        used.append(lr)
        return torch.optim.SGD(params, lr=lr * 5, momentum=0.9)

    model = classifier(model=net, optimizerFactory=factory, maxEpoch=2).fit(vector_df(spark, 80))
    assert used == [0.02]
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_loading_with_a_model_factory_unpickles_nothing(spark, tmp_path):
    import os

    df = vector_df(spark, 80)
    model = classifier().fit(df)
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    os.remove(os.path.join(path, "module.pkl"))           # nothing pickled is left to read
    loaded = NNClassifierModel.load(path, model=mlp4)
    assert collect(loaded.transform(df), "rawPrediction") == \
        collect(model.transform(df), "rawPrediction")
    with pytest.raises(Exception, match="module.pkl"):
        NNClassifierModel.load(path)
    with pytest.raises(InvalidArgumentError, match=r"'model' factory passed to "
                                                   r"NNClassifierModel\.load must return"):
        NNClassifierModel.load(path, model=lambda: "not a module")
