"""Checkpoints belong to their fit (issue 22, acceptance 2): a reused checkpoint directory with
other data, hyperparameters or initial weights never resumes silently; "train longer" resumes;
tuning grids with checkpointDir fit every setting."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from df_helpers import mlp4, vector_df
from models import SmallNet, bitwise_equal, classification_data, make_rdd
from sparkdl import CheckpointError, DistriOptimizer, NNClassifier
from sparkdl.triggers import EveryEpoch, MaxEpoch

SIZES = [40, 35]


def engine(sc, epochs, data_seed=1, lr=0.02, init_seed=3, criterion=None):
    x, y = classification_data(sum(SIZES), seed=data_seed)
    torch.manual_seed(init_seed)
    net = SmallNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    return DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES),
                           criterion or torch.nn.CrossEntropyLoss(), optimizer, batch_size=25,
                           end_trigger=MaxEpoch(epochs), seed=2, progress_bar=False)


@pytest.mark.parametrize("change,what", [
    (dict(data_seed=9), "data="), (dict(lr=0.05), "optimizer="),
    (dict(init_seed=4), "model="),
    (dict(criterion=torch.nn.CrossEntropyLoss(label_smoothing=0.1)), "criterion=")])
def test_another_fit_in_the_same_directory_is_refused_naming_what_differs(sc, tmp_path,
                                                                          change, what):
    engine(sc, 1).set_checkpoint(str(tmp_path), EveryEpoch()).optimize()
    other = engine(sc, 2, **change).set_checkpoint(str(tmp_path), EveryEpoch())
    with pytest.raises(CheckpointError, match=f"belongs to another fit: .*{what}"):
        other.optimize()


def test_training_longer_resumes_and_other_fits_get_their_own_subdirectory(sc, tmp_path):
    longer = engine(sc, 4).optimize()
    engine(sc, 2).set_checkpoint(str(tmp_path), EveryEpoch(), by_fit=True).optimize()
    resumed_opt = engine(sc, 4).set_checkpoint(str(tmp_path), EveryEpoch(), by_fit=True)
    resumed = resumed_opt.optimize()
    assert len(resumed_opt.summary.iterations) == 4 * 3   # 2 epochs restored, 2 trained
    assert bitwise_equal(resumed, longer)
    assert len(os.listdir(tmp_path)) == 1                 # the same fit: the same subdirectory
    fresh = engine(sc, 2, data_seed=9).set_checkpoint(str(tmp_path), EveryEpoch(),
                                                      by_fit=True).optimize()
    assert bitwise_equal(fresh, engine(sc, 2, data_seed=9).optimize())   # not resumed
    assert len(os.listdir(tmp_path)) == 2


def grid(est):
    from pyspark.ml.tuning import ParamGridBuilder

    return ParamGridBuilder().addGrid(est.learningRate, [0.005, 0.05]).build()


@pytest.mark.parametrize("tuner", ["cross-validator", "train-validation-split"])
def test_tuning_grids_with_checkpoint_dir_fit_every_setting(spark, tmp_path, tuner):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, TrainValidationSplit

    df = vector_df(spark, 160).repartition(2).cache()

    def tune(checkpoint_dir):
        est = NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), batchSize=32,
                           maxEpoch=2, seed=0, progressBar=False, numTrainWorkers=2,
                           **({"checkpointDir": checkpoint_dir} if checkpoint_dir else {}))
        evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
        if tuner == "cross-validator":
            t = CrossValidator(estimator=est, estimatorParamMaps=grid(est), evaluator=evaluator,
                               numFolds=2, seed=1)
        else:
            t = TrainValidationSplit(estimator=est, estimatorParamMaps=grid(est),
                                     evaluator=evaluator, trainRatio=0.6, seed=1)
        model = t.fit(df)
        return model, (model.avgMetrics if tuner == "cross-validator"
                       else model.validationMetrics)

    plain_model, plain = tune(None)
    checked_model, checked = tune(str(tmp_path))
    assert list(checked) == list(plain)
    fits = len(os.listdir(tmp_path))
    assert fits == (2 * 2 + 1 if tuner == "cross-validator" else 2 + 1)   # + the refit
    assert bitwise_equal(checked_model.bestModel.module, plain_model.bestModel.module)
    np.testing.assert_array_equal(
        [r.prediction for r in checked_model.transform(df).select("prediction").collect()],
        [r.prediction for r in plain_model.transform(df).select("prediction").collect()])
