"""Bad input at the edges (issue 39): embedding ids out of their table's range, mixed numeric
kinds, the validation indicator column, save and load paths, transform's input schema against
the fit's, and messages that read well. Every error names the column, Param, value or path; the
ones the schema or the Params decide come before any Spark job."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

from models import JobCounter, make_rdd
from pyspark.sql import functions as F
from sparkdl import (CheckpointError, DistriOptimizer, InvalidArgumentError, NNClassifier,
                     TrainingDataError, TrainingStepError)
from sparkdl.errors import EmptyDataError
from sparkdl.ml.estimators import NNClassifierModel, NNModel
from sparkdl.triggers import EveryEpoch, MaxIteration


class UserNet(nn.Module):
    """One id per row (a scalar column, or a 1-value array) through a 20-row table."""

    def __init__(self, rows: int = 20, classes: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, 4, sparse=True)
        self.head = nn.Linear(4, classes)

    def forward(self, user: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(user).reshape(len(user), -1))


SPLITS = [[24], [12, 12], [8, 8, 8]]


def where(index: int, sizes: list[int]) -> tuple[int, int]:
    """(partition, record) of the global record ``index`` under ``sizes``."""
    for p, n in enumerate(sizes):
        if index < n:
            return p, index
        index -= n
    raise AssertionError


def id_records(bad_at: int | None = None, bad_id: int = 25, n: int = 24) -> list:
    records = [(np.array([i % 20], np.int64), i % 3) for i in range(n)]
    if bad_at is not None:
        records[bad_at] = (np.array([bad_id], np.int64), 0)
    return records


def fit_engine(sc, records, sizes, net=None):
    net = net or UserNet()
    opt = DistriOptimizer(net, make_rdd(sc, records, sizes), nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=24,
                          end_trigger=MaxIteration(1), progress_bar=False)
    return opt.optimize()


# ------------------------------------------------------------------------------ embedding ids
@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("bad_id,problem", [
    (25, r"embedding 'emb' has 20 rows \(ids 0\.\.19\)"),
    (-3, r"ids must be >= 0 \(embedding 'emb' has 20 rows\)")])
def test_an_id_out_of_range_names_id_table_partition_and_record(sc, sizes, bad_id, problem):
    """Record 17 is not among the dry run's samples: the task finds it, at iteration 1, and
    reports a TrainingDataError Spark does not retry; every partitioning says the same."""
    partition, record = where(17, sizes)
    with pytest.raises(TrainingDataError) as info:
        fit_engine(sc, id_records(17, bad_id), sizes)
    message = str(info.value)
    assert f"The features hold id {bad_id}, but " in message
    assert f"record {record} of partition {partition} of the training data" in message
    assert info.match(problem)


def test_an_id_out_of_range_in_the_dry_runs_samples(sc):
    with pytest.raises(TrainingDataError, match=r"The features hold id 25, but embedding 'emb' "
                                                r"has 20 rows .*record 2 of partition 0 of the "
                                                r"training data"):
        fit_engine(sc, id_records(2), [12, 12])


def test_ids_in_range_train(sc):
    trained = fit_engine(sc, id_records(), [12, 12])
    assert torch.isfinite(trained.emb.weight).all()


def test_an_id_the_model_computes_names_the_table():
    from sparkdl.executor.id_checks import IdOrigin, checked_ids

    net = UserNet()
    ids = torch.tensor([[1], [19]])
    with pytest.raises(TrainingDataError, match=r"The model looks up id 20 in embedding 'emb', "
                                                r"but embedding 'emb' has 20 rows .*a batch of "
                                                r"partition 4"):
        with checked_ids(net, [ids], IdOrigin(partition=4, records=np.array([7, 8]))):
            net(ids + 1)


class LearnedPositions(nn.Embedding):
    """Hugging Face's learned positional embeddings' shape: given token ids, it looks up their
    positions (with an offset), so the ids themselves are never rows of it."""

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        return super().forward(positions + 2)


def test_an_embedding_with_its_own_forward_is_not_checked_as_ids():
    from sparkdl.executor.id_checks import IdOrigin, checked_ids

    positions, tokens = LearnedPositions(8, 3), nn.Embedding(5000, 3)
    ids = torch.tensor([[4000, 12, 7]])        # token ids far above the 8 positions
    with checked_ids(nn.ModuleList([positions, tokens]), [ids], IdOrigin()):
        assert positions(ids).shape == (1, 3, 3) and tokens(ids).shape == (1, 3, 3)
    with pytest.raises(TrainingDataError, match=r"id 5000 in embedding '1', but embedding '1' "
                                                r"has 5000 rows"):
        with checked_ids(nn.ModuleList([positions, tokens]), [ids + 1000], IdOrigin()):
            tokens(ids + 1000)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_an_id_column_out_of_range_names_the_column(spark, workers):
    rows = [(i % 20, i % 3) for i in range(40)]
    rows[33] = (30, 0)
    df = spark.createDataFrame(rows, ["user", "label"])
    clf = NNClassifier(model=UserNet, criterion=nn.CrossEntropyLoss(), inputCols=["user"],
                       batchSize=40, maxEpoch=1, optimizer="sgd", numTrainWorkers=workers,
                       progressBar=False)
    with pytest.raises(TrainingDataError, match=r"Column 'user' holds id 30, but embedding 'emb' "
                                                r"has 20 rows \(ids 0\.\.19\): record \d+ of "
                                                r"partition \d+ of the training data"):
        clf.fit(df)


def test_transform_names_the_column_of_an_id_out_of_range(spark):
    df = spark.createDataFrame([(i % 20, i % 3) for i in range(40)], ["user", "label"])
    model = NNClassifier(model=UserNet, criterion=nn.CrossEntropyLoss(), inputCols=["user"],
                         batchSize=40, maxEpoch=1, optimizer="sgd", progressBar=False).fit(df)
    bad = spark.createDataFrame([(3, 0), (20, 1)], ["user", "label"])
    with pytest.raises(Exception, match=r"InvalidArgumentError: Column 'user' holds id 20, but "
                                        r"embedding 'emb' has 20 rows"):
        model.transform(bad).collect()


# ------------------------------------------------------------------------ mixed numeric kinds
def _mixed(kind: str) -> list:
    """Records 0-11 int, 12-23 float: within one partition, across two, both under three."""
    x = np.random.default_rng(0).normal(size=(24, 6))
    records = []
    for i in range(24):
        late = i >= 12
        if kind == "labels":
            records.append((x[i].astype(np.float32), float(i % 3) if late else i % 3))
        else:
            records.append(((x[i] * 3).round().astype(np.float32 if late else np.int64), i % 3))
    return records


@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("kind", ["labels", "features"])
def test_mixed_int_and_float_get_one_error_whatever_the_partitioning(sc, sizes, kind):
    from models import SmallNet

    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, _mixed(kind), sizes), nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                          end_trigger=MaxIteration(1), progress_bar=False)
    with pytest.raises(TrainingDataError,
                       match=rf"^The training RDD mixes int and float {kind}: .* has int {kind} "
                             rf"but .* has float {kind}\. Make every record's {kind} the same "
                             "kind"):
        opt.optimize()
    assert opt.summary.iterations == []


# --------------------------------------------------------------------- validationIndicatorCol
def _small_df(spark, n=60, indicator=lambda i: i % 4 == 0):
    return spark.createDataFrame([([float(i % 7), float(i % 5), 1.0, 0.5], i % 3, indicator(i))
                                  for i in range(n)], ["features", "label", "isVal"])


def _clf(**params):
    from df_helpers import mlp4

    return NNClassifier(model=mlp4, criterion=nn.CrossEntropyLoss(), batchSize=16, maxEpoch=1,
                        progressBar=False, **params)


def test_an_int_validation_indicator_is_refused_before_any_job(spark, sc):
    df = _small_df(spark).withColumn("isVal", F.col("isVal").cast("int"))
    with JobCounter(sc) as jobs:
        with pytest.raises(InvalidArgumentError, match=r"validationIndicatorCol 'isVal' must be "
                                                       r"boolean .*; it is int\."):
            _clf(validationIndicatorCol="isVal").fit(df)
        assert jobs.count == 0


def test_every_row_marked_for_validation(spark):
    df = _small_df(spark, indicator=lambda i: True)
    with pytest.raises(EmptyDataError, match=r"^validationIndicatorCol 'isVal' is true for all "
                                             r"60 rows: nothing left to train on\.$"):
        _clf(validationIndicatorCol="isVal").fit(df)


def test_no_row_marked_for_validation(spark):
    df = _small_df(spark, indicator=lambda i: False)
    with pytest.raises(TrainingDataError, match=r"^validationIndicatorCol 'isVal' is false for all "
                                                r"60 rows: no row to validate on\.$"):
        _clf(validationIndicatorCol="isVal").fit(df)


def test_an_empty_dataframe_speaks_of_rows_not_partitions(spark):
    df = _small_df(spark).limit(0)
    with pytest.raises(TrainingDataError, match=r"^The DataFrame given to fit has no rows") as info:
        _clf().fit(df)
    assert "RDD" not in str(info.value) and "partition" not in str(info.value)


def test_array_labels_for_a_classifier_are_refused_before_any_job(spark, sc):
    df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], [1.0, 0.0])] * 8, ["features", "label"])
    with JobCounter(sc) as jobs:
        with pytest.raises(InvalidArgumentError, match=r"Column 'label' \(labelCol\) has type "
                                                       r"array<double>; a classifier takes one "
                                                       r"0-based class index per row"):
            _clf().fit(df)
        assert jobs.count == 0


def test_all_zero_sample_weights_name_the_weight_column(spark):
    df = _small_df(spark).withColumn("w", F.lit(0.0))
    with pytest.raises(TrainingDataError, match=r"the sample weights of the batch sum to 0\.0.*"
                                                r"weights: column 'w'"):
        _clf(weightCol="w").fit(df)


def test_a_training_step_whose_normaliser_is_zero(sc):
    from models import SmallNet, classification_data

    x, y = classification_data(16)
    net = SmallNet()

    def step(model, inputs, target):
        return nn.functional.cross_entropy(model(*inputs), target, reduction="sum") * 0, \
            torch.tensor(0.0)

    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [8, 8]), None,
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                          end_trigger=MaxIteration(1), progress_bar=False, training_step=step)
    with pytest.raises(TrainingStepError, match=r"iteration 1: the training step's normalisers "
                                                r"over the batch sum to 0"):
        opt.optimize()


# -------------------------------------------------------------------------------- paths
def test_save_to_an_existing_path_names_it_and_overwrite(spark, tmp_path):
    df = _small_df(spark)
    model = _clf().fit(df)
    path = str(tmp_path / "m")
    model.write().save(path)
    before = {f: open(f, "rb").read() for f in glob.glob(f"{path}/**/*", recursive=True)
              if os.path.isfile(f)}
    with pytest.raises(InvalidArgumentError, match=rf"'{path}': the path already exists\. To "
                                                   rf"replace it, save with "
                                                   rf"write\(\)\.overwrite\(\)\.save\('{path}'\)"):
        model.write().save(path)
    after = {f: open(f, "rb").read() for f in glob.glob(f"{path}/**/*", recursive=True)
             if os.path.isfile(f)}
    assert after == before
    model.write().overwrite().save(path)
    assert NNClassifierModel.load(path).uid == model.uid


def test_load_of_a_directory_that_is_not_a_stage(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InvalidArgumentError, match=r"is not a saved sparkdl stage \(no "
                                                   r"metadata/\): it holds notes\.txt"):
        NNModel.load(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match=r"does not exist or is empty"):
        NNModel.load(str(tmp_path / "nothing"))


@pytest.mark.parametrize("make", ["directory-file", "unwritable"])
def test_a_checkpoint_path_that_cannot_be_written_reads_well(sc, tmp_path, make):
    from models import SmallNet, classification_data

    if make == "directory-file":
        path = tmp_path / "a-file"
        path.write_text("x")
        expected = r"is not writable: Destination exists and is not a directory"
    else:
        path = "/proc/sparkdl-edge-ckpt"
        expected = r"is not writable: Mkdirs failed to create /proc/sparkdl-edge-ckpt"
    x, y = classification_data(8)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [8]), nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8)
    with pytest.raises(CheckpointError, match=expected) as info:
        opt.set_checkpoint(str(path), EveryEpoch())
        opt.optimize()
    assert ": :" not in str(info.value) and "java." not in str(info.value)


# --------------------------------------------------------------- transform against the fit
def _array_df(spark, element="double", width=4, n=24):
    df = spark.createDataFrame([([float((i + k) % 5) for k in range(width)], i % 3)
                                for i in range(n)], ["features", "label"])
    return df.withColumn("features", F.col("features").cast(f"array<{element}>"))


@pytest.fixture(scope="module")
def fitted_on_doubles(spark):
    return NNClassifier(model=lambda: nn.Linear(4, 3), criterion=nn.CrossEntropyLoss(),
                        batchSize=24, maxEpoch=1, progressBar=False).fit(_array_df(spark))


def test_int_features_are_cast_to_the_fitted_float_dtype(spark, fitted_on_doubles):
    got = fitted_on_doubles.transform(_array_df(spark, "int")).select("rawPrediction").collect()
    want = fitted_on_doubles.transform(_array_df(spark)).select("rawPrediction").collect()
    assert got == want


def test_too_many_values_per_row_are_refused_naming_the_column(spark, fitted_on_doubles):
    with pytest.raises(InvalidArgumentError, match=r"Column 'features' \(array<double>\) does "
                                                   r"not fit the model: it has 5 values per row "
                                                   r"\(the first row read\); the model was "
                                                   r"fitted on 4"):
        fitted_on_doubles.transform(_array_df(spark, width=5))   # before transform's job
    # a later row of another width: the tasks check every row, before the model runs
    rows = [([float((i + k) % 5) for k in range(4 if i < 23 else 5)], i % 3) for i in range(24)]
    mixed = spark.createDataFrame(rows, "features array<double>, label long").coalesce(1)
    out = fitted_on_doubles.transform(mixed)
    with pytest.raises(Exception, match=r"InvalidArgumentError: Column 'features' has 5 values "
                                        r"per row; the model was fitted on 4"):
        out.collect()


def test_a_vector_assembler_width_is_checked_before_any_job(spark, sc, fitted_on_doubles):
    from pyspark.ml.feature import VectorAssembler

    df = VectorAssembler(inputCols=["a", "b", "c", "d", "e"], outputCol="features").transform(
        spark.createDataFrame([(1.0, 2.0, 3.0, 4.0, 5.0, 0)], ["a", "b", "c", "d", "e", "label"]))
    with JobCounter(sc) as jobs:
        with pytest.raises(InvalidArgumentError, match=r"Column 'features' \(vector\) does not "
                                                       r"fit the model: it has 5 values per row; "
                                                       r"the model was fitted on 4 \(the model was "
                                                       r"fitted on array column 'features' of "
                                                       r"type array<double>\)"):
            fitted_on_doubles.transform(df)
        assert jobs.count == 0


def test_float_values_for_fitted_ids_are_refused_before_any_job(spark, sc):
    df = spark.createDataFrame([(i % 20, i % 3) for i in range(24)], ["user", "label"])
    model = NNClassifier(model=UserNet, criterion=nn.CrossEntropyLoss(), inputCols=["user"],
                         batchSize=24, maxEpoch=1, optimizer="sgd", progressBar=False).fit(df)
    floats = spark.createDataFrame([(1.5, 0)], ["user", "label"])
    with JobCounter(sc) as jobs:
        with pytest.raises(InvalidArgumentError, match=r"Column 'user' \(double\) does not fit "
                                                       r"the model: it holds floating values "
                                                       r"where the fit took integer ids .*scalar "
                                                       r"column 'user' of type bigint"):
            model.transform(floats)
        assert jobs.count == 0


def test_a_different_number_of_inputs_is_refused(spark, fitted_on_doubles):
    df = _array_df(spark).withColumn("other", F.col("features"))
    with pytest.raises(InvalidArgumentError, match=r"transform has 2 model input\(s\) "
                                                   r"\(\['features', 'other'\]\) but the model "
                                                   r"was fitted on 1 \(\['features'\]\)"):
        fitted_on_doubles.transform(df, {fitted_on_doubles.inputCols: ["features", "other"]})


def test_a_loaded_model_checks_and_an_old_one_without_the_record_still_transforms(
        spark, fitted_on_doubles, tmp_path):
    path = str(tmp_path / "m")
    fitted_on_doubles.write().save(path)
    loaded = NNClassifierModel.load(path)
    assert loaded.input_record == fitted_on_doubles.input_record
    with pytest.raises(InvalidArgumentError, match=r"Column 'features' .*it has 5 values per "
                                                   r"row .*the model was fitted on 4"):
        loaded.transform(_array_df(spark, width=5))
    # a model saved before the record existed: its metadata has no "inputs"
    (meta,) = glob.glob(f"{path}/metadata/part-*")
    data = json.loads(open(meta).read())
    del data["inputs"]
    with open(meta, "w") as f:
        f.write(json.dumps(data))
    for crc in glob.glob(f"{path}/metadata/.part-*.crc"):   # Hadoop's checksum of the old text
        os.remove(crc)
    old = NNClassifierModel.load(path)
    assert old.input_record is None
    got = old.transform(_array_df(spark)).select("rawPrediction").collect()
    assert got == fitted_on_doubles.transform(_array_df(spark)).select("rawPrediction").collect()
