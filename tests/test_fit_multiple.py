"""The estimators' fitMultiple trains the param maps together (sparkdl.ml.fit_together): every
model is bitwise its param map's own fit, one pass over data held once, pyspark's tuners on
top."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import functions as F

from df_helpers import mlp4, vector_df
from models import JobCounter
from sparkdl import NNClassifier


def classifier(**params):
    base = dict(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), batchSize=16, maxEpoch=2,
                learningRate=0.02, optimizer="sgd", momentum=0.9, seed=0, progressBar=False,
                numTrainWorkers=3)
    base.update(params)
    return NNClassifier(**base)


def same_bytes(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].numpy().tobytes() == sb[k].numpy().tobytes() for k in sa)


def test_fit_multiple_trains_a_grid_in_one_pass_bitwise_as_the_fits_alone(spark, sc):
    """lr x weight decay, plus one setting with another batchSize and maxEpoch: every model is
    bitwise its param map's own fit; the jobs are those of one fit plus a constant, the shards
    built once."""
    df = vector_df(spark, 96)
    clf = classifier()
    grid = (ParamGridBuilder().addGrid(clf.learningRate, [0.05, 0.01])
            .addGrid(clf.weightDecay, [0.0, 1e-3]).build())
    grid.append({clf.learningRate: 0.03, clf.batchSize: 24, clf.maxEpoch: 3})
    alone, alone_jobs = [], []
    for param_map in grid:
        with JobCounter(sc) as jobs:
            alone.append(clf.fit(df, param_map))
        alone_jobs.append(jobs.count)
    with JobCounter(sc) as jobs:
        together = clf.fitMultiple(df, grid)
        models = dict(together)
    assert sorted(models) == list(range(len(grid)))
    for k, model in models.items():
        assert same_bytes(model, alone[k]), k
        assert model.getLearningRate() == grid[k][clf.learningRate]
        assert model.uid == clf.uid
    assert together.passes == [list(range(len(grid)))]
    assert together.loads == 1             # the training shards, built once
    assert jobs.count <= 1.5 * max(alone_jobs) + 5, (jobs.count, alone_jobs)
    predictions = [r.prediction for r in models[4].transform(df).select("prediction").collect()]
    assert predictions == [r.prediction for r in
                           alone[4].transform(df).select("prediction").collect()]


def test_cross_validator_sub_models_are_bitwise_the_folds_single_fits(spark):
    """2 folds (a fold column), 4 settings, parallelism 2, collectSubModels: each fold's
    sub-models are bitwise the single fits on that fold's training rows."""
    df = vector_df(spark, 96).withColumn("fold", (F.monotonically_increasing_id() % 2)
                                         .cast("int"))
    clf = classifier()
    grid = (ParamGridBuilder().addGrid(clf.learningRate, [0.05, 0.01])
            .addGrid(clf.batchSize, [16, 32]).build())
    cv = CrossValidator(estimator=clf, estimatorParamMaps=grid, numFolds=2, parallelism=2,
                        foldCol="fold", collectSubModels=True,
                        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    cv_model = cv.fit(df)
    for fold in range(2):
        train = df.filter(F.col("fold") != fold)
        for k, param_map in enumerate(grid):
            single = clf.fit(train, param_map)
            assert same_bytes(cv_model.subModels[fold][k], single), (fold, k)
    assert len(cv_model.avgMetrics) == 4


def test_param_maps_that_read_other_columns_train_in_passes_of_their_own(spark, caplog):
    df = vector_df(spark, 64).withColumn("features2", F.col("features"))
    clf = classifier(maxEpoch=1)
    grid = [{clf.learningRate: 0.05}, {clf.featuresCol: "features2"},
            {clf.learningRate: 0.01}]
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        together = clf.fitMultiple(df, grid)
        models = dict(together)
    assert together.passes == [[0, 2], [1]]
    assert "3 fits train in 2 passes" in caplog.text
    assert same_bytes(models[1], clf.fit(df, grid[1]))


def test_a_failing_param_map_raises_at_its_index_and_the_others_train(spark):
    df = vector_df(spark, 64)
    clf = classifier(maxEpoch=1)
    grid = [{clf.learningRate: 0.05}, {clf.learningRate: 1e30}, {clf.learningRate: 0.01}]
    together = clf.fitMultiple(df, grid)
    got, errors = {}, {}
    for _ in grid:
        try:
            index, model = next(together)
            got[index] = model
        except Exception as exc:          # the failing index's error, at its turn
            errors[len(got) + len(errors)] = exc
    assert sorted(got) == [0, 2] and list(errors) == [1]
    assert "non-finite" in str(errors[1]) or "loss is" in str(errors[1])
    assert same_bytes(got[2], clf.fit(df, grid[2]))
    with pytest.raises(StopIteration):
        next(together)
    assert np.isfinite(got[0].state_dict()["0.weight"].numpy()).all()


def test_cross_validator_with_hop_sub_models_are_single_process_torch_in_their_order(spark):
    """tuningStrategy='hop': each fold's sub-model k is single-process torch trained over that
    fold's partitions in the visiting order of rotation position k (within 1e-6)."""
    import copy

    from models import hop_reference, max_abs_diff
    from sparkdl.data.records import convert_records

    df = vector_df(spark, 96).withColumn("fold", (F.monotonically_increasing_id() % 2)
                                         .cast("int"))
    clf = classifier(tuningStrategy="hop")
    grid = (ParamGridBuilder().addGrid(clf.learningRate, [0.05, 0.01])
            .addGrid(clf.batchSize, [8, 16]).build())
    cv = CrossValidator(estimator=clf, estimatorParamMaps=grid, numFolds=2, parallelism=2,
                        foldCol="fold", collectSubModels=True,
                        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    cv_model = cv.fit(df)
    assert len(cv_model.avgMetrics) == 4
    for fold in range(2):
        train = df.filter(F.col("fold") != fold)
        for k, param_map in enumerate(grid):
            engine = clf.copy(param_map)._prepare_fit(train, {}).engine
            partitions = []
            for p, records in enumerate(engine.training_rdd.glom().collect()):
                features, labels = convert_records(p, iter(records), np.dtype("float32"), ())
                partitions.append((features[0], labels))
            model = copy.deepcopy(engine.model)
            optimizer = type(engine.optimizer)(model.parameters())
            optimizer.load_state_dict(engine.optimizer.state_dict())     # its settings
            hop_reference(model, optimizer, partitions, torch.nn.CrossEntropyLoss(),
                          engine.batch_size, engine.seed, 2, position=k)
            difference = max_abs_diff(cv_model.subModels[fold][k], model)
            assert difference <= 1e-6, (fold, k, difference)
    # the final model CrossValidator refits on the whole data is the data-parallel fit
    best = int(np.argmax(cv_model.avgMetrics))
    assert same_bytes(cv_model.bestModel, clf.copy({clf.tuningStrategy: "together"}).fit(
        df, grid[best]))


def test_a_param_map_cannot_change_the_tuning_strategy(spark):
    from sparkdl.errors import InvalidArgumentError

    clf = classifier()
    with pytest.raises(InvalidArgumentError, match="tuningStrategy"):
        clf.fitMultiple(vector_df(spark, 32), [{clf.tuningStrategy: "hop"}])
