"""Conformance of every public stage to Spark ML's contract (in the spirit of scikit-learn's
``check_estimator``): defaults, copy, Param validation, model/estimator ties, output types,
executor-bound objects."""

from __future__ import annotations

import pickle

import pytest
import torch
from pyspark import cloudpickle

from df_helpers import mlp4, vector_df
from sparkdl import InvalidArgumentError, NNClassifier, NNClassifierModel, NNEstimator, NNModel

ESTIMATORS = {
    "NNEstimator": lambda: NNEstimator(model=lambda: torch.nn.Linear(4, 1),
                                       criterion=torch.nn.MSELoss(), maxEpoch=1, batchSize=32),
    "NNClassifier": lambda: NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(),
                                         maxEpoch=1, batchSize=32),
}
INVALID = {  # Param -> a value of the right JSON type that is out of range
    "batchSize": 0, "maxEpoch": -1, "learningRate": 0.0, "momentum": -0.5, "weightDecay": -1.0,
    "optimizer": "lbfgs", "numTrainWorkers": -2, "microBatchSize": -1,
    "inferenceBatchSize": 0, "featureShape": [0, 4], "labelCol": "",
    "device": "gpu", "precision": "fp8", "inputCols": ["features", "features"],
    "gradientClipNorm": -1.0, "earlyStoppingPatience": -1, "validationMetrics": ["auc"],
    "sequenceCols": ["features", "features"],
}


@pytest.fixture(scope="module")
def fitted(spark):
    from pyspark.sql import functions as F

    df = vector_df(spark, 64).withColumn("y", F.col("label") * 1.0)
    reg = ESTIMATORS["NNEstimator"]().setLabelCol("y").setFeatureShape([4])
    reg.model_spec = lambda: torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Flatten(0))
    clf = ESTIMATORS["NNClassifier"]()
    return {"NNEstimator": (reg, reg.fit(df)), "NNClassifier": (clf, clf.fit(df)), "df": df}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_param_has_a_default_or_value_and_is_json(name):
    import json

    est = ESTIMATORS[name]()
    for param in est.params:
        assert est.isDefined(param), f"{name}.{param.name} has no default"
        json.dumps(est.getOrDefault(param))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_copy_keeps_state_apart(name):
    est = ESTIMATORS[name]()
    other = est.copy({est.batchSize: 7})
    assert other.getBatchSize() == 7 and est.getBatchSize() == 32
    other.setLearningRate(0.5)
    assert est.getLearningRate() == 1e-3
    assert other.uid == est.uid and other.model_spec is est.model_spec


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("param", list(INVALID))
def test_invalid_param_value_is_rejected_before_cluster_work(spark, name, param):
    base = ESTIMATORS[name]()
    est = base.copy({base.getParam(param): INVALID[param]})
    with pytest.raises(InvalidArgumentError,
                       match=rf"^The '{param}' Param of {name} must be .*\. Got .* instead\.$"):
        est.fit(spark.createDataFrame([([1.0] * 4, 0)], ["features", "label"]))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_model_carries_the_estimator_uid_and_params(fitted, name):
    est, model = fitted[name]
    assert model.uid == est.uid
    for param in est.params:
        if model.hasParam(param.name):
            assert model.getOrDefault(param.name) == est.getOrDefault(param.name), param.name
    assert isinstance(model, NNClassifierModel if name == "NNClassifier" else NNModel)


def test_output_column_types(fitted):
    df = fitted["df"]
    reg = dict(fitted["NNEstimator"][1].transform(df).dtypes)
    assert reg["prediction"] == "double"
    clf = dict(fitted["NNClassifier"][1].transform(df).dtypes)
    assert (clf["prediction"], clf["probability"], clf["rawPrediction"]) == \
        ("double", "vector", "vector")


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_executor_bound_objects_pickle(fitted, name):
    est, model = fitted[name]
    for obj in (est.model_spec, est.criterion, model.module):
        restored = pickle.loads(cloudpickle.dumps(obj))
        assert type(restored).__name__ == type(obj).__name__
    from sparkdl.data.dataframe_arrays import FeatureSource
    from sparkdl.ml.inference import predict_column

    udf = predict_column(model.module, [FeatureSource("vector", ("features",))], [], None, 8,
                         name == "NNClassifier", name != "NNClassifier")
    cloudpickle.dumps(udf.func)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_params_have_spark_style_accessors(name):
    est = ESTIMATORS[name]()
    for param in est.params:
        cap = param.name[0].upper() + param.name[1:]
        assert callable(getattr(est, "get" + cap)), f"get{cap}"
        assert callable(getattr(est, "set" + cap)), f"set{cap}"


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_unknown_keyword_is_rejected(name):
    cls = type(ESTIMATORS[name]())
    with pytest.raises(InvalidArgumentError, match=rf"{name} has no Param 'batch_size'; its "
                                                   r"Params are \["):
        cls(batch_size=3)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_model_params_are_validated_at_transform(fitted, name):
    model = fitted[name][1]
    bad = model.copy({model.getParam("inferenceBatchSize"): 0})
    model_name = type(model).__name__
    with pytest.raises(InvalidArgumentError, match=rf"The 'inferenceBatchSize' Param of "
                                                   rf"{model_name} must be a positive int"):
        bad.transform(fitted["df"])
