"""The DataFrame API for real data (issue: ids, several inputs, ...): integer columns reach the
model as int64, ``inputCols`` feeds one column per model argument, label types are checked at
fit, transform handles empty batches and one-logit classifiers the way validation does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from df_helpers import (IdBagClassifier, ThreeInputNet, id_bags, mlp4, three_input_rows,
                        vector_df)
from models import max_abs_diff, reference_train
from sparkdl import BatchPlan, InvalidArgumentError, NNClassifier, NNEstimator
from sparkdl.ml.estimators import NNModel


def test_embedding_bag_over_bigint_ids_learns_what_only_ids_solve(spark):
    """Acceptance 1: an array<bigint> column reaches an EmbeddingBag as int64 ids."""
    rows, labels = id_bags(900)
    df = spark.createDataFrame([(r, int(c)) for r, c in zip(rows, labels)], ["ids", "label"])
    assert df.schema["ids"].dataType.simpleString() == "array<bigint>"
    train, test = df.limit(600), spark.createDataFrame(df.tail(300))
    clf = NNClassifier(model=IdBagClassifier, criterion=torch.nn.CrossEntropyLoss(),
                       featuresCol="ids", maxEpoch=15, batchSize=64, learningRate=0.02,
                       seed=1, progressBar=False)
    out = clf.fit(train).transform(test).select("label", "prediction").toPandas()
    accuracy = float((out["label"] == out["prediction"]).mean())
    assert accuracy >= 0.95, accuracy


def _three_input_df(spark, n=120, partitions=1):
    from pyspark.ml.linalg import Vectors

    users, tags, dense, y = three_input_rows(n)
    rows = [(int(u), [int(t) for t in ts], Vectors.dense(d), float(v))
            for u, ts, d, v in zip(users, tags, dense, y)]
    df = spark.createDataFrame(rows, ["user", "tags", "dense", "y"]).coalesce(partitions)
    return df, (users.astype(np.int64), tags.astype(np.int64), dense.astype(np.float32),
                y.astype(np.float32))


def test_input_cols_train_like_single_process_torch(spark):
    """Acceptance 2: three columns of different kinds and dtypes, one model argument each;
    the fitted weights match plain PyTorch on the same union batches."""
    df, (users, tags, dense, y) = _three_input_df(spark)
    torch.manual_seed(0)
    net = ThreeInputNet()
    est = NNEstimator(model=net, criterion=torch.nn.MSELoss(),
                      optimizerFactory=lambda p: torch.optim.SGD(p, lr=0.05),
                      inputCols=["user", "tags", "dense"], labelCol="y", maxEpoch=2,
                      batchSize=16, numTrainWorkers=1, seed=3, progressBar=False)
    fitted = est.fit(df)
    plan = BatchPlan([len(y)], 16, 3, True)
    expected = reference_train(net, (users, tags, dense), y, torch.nn.MSELoss(),
                               lambda m: torch.optim.SGD(m.parameters(), lr=0.05), plan,
                               2 * plan.iterations_per_epoch)
    assert max_abs_diff(fitted.module, expected) < 1e-5
    predictions = fitted.transform(df).select("prediction").toPandas()["prediction"]
    with torch.no_grad():
        direct = expected(torch.from_numpy(users), torch.from_numpy(tags),
                          torch.from_numpy(dense)).numpy()
    np.testing.assert_allclose(predictions.to_numpy(), direct, rtol=1e-4, atol=1e-5)


def test_input_cols_save_and_load(spark, tmp_path):
    df, _ = _three_input_df(spark, 60)
    est = NNEstimator(model=ThreeInputNet, criterion=torch.nn.MSELoss(),
                      inputCols=["user", "tags", "dense"], labelCol="y", maxEpoch=1,
                      batchSize=16, progressBar=False)
    est.write().overwrite().save(str(tmp_path / "est"))
    loaded_est = NNEstimator.load(str(tmp_path / "est"))
    assert loaded_est.getInputCols() == ["user", "tags", "dense"]
    model = est.fit(df)
    model.write().overwrite().save(str(tmp_path / "model"))
    again = NNModel.load(str(tmp_path / "model"))
    assert again.getInputCols() == ["user", "tags", "dense"]
    a = model.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    b = again.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    np.testing.assert_array_equal(a, b)


def test_input_cols_and_features_col_together_are_refused(spark):
    df, _ = _three_input_df(spark, 20)
    est = NNEstimator(model=ThreeInputNet, criterion=torch.nn.MSELoss(), labelCol="y",
                      inputCols=["user", "tags", "dense"], featuresCol="dense")
    with pytest.raises(InvalidArgumentError, match="both inputCols and featuresCol set"):
        est.fit(df)


def test_input_cols_name_a_bad_column(spark):
    df, _ = _three_input_df(spark, 20)
    df = df.withColumn("name", df["user"].cast("string"))
    est = NNEstimator(model=ThreeInputNet, criterion=torch.nn.MSELoss(), labelCol="y",
                      inputCols=["user", "name", "dense"])
    with pytest.raises(InvalidArgumentError, match=r"Column 'name' \(in inputCols\) has type "
                                                   r"string"):
        est.fit(df)
    est.setInputCols(["user", "nope", "dense"])
    with pytest.raises(InvalidArgumentError, match=r"Column 'nope' \(in inputCols\) does not "
                                                   r"exist"):
        est.fit(df)


@pytest.mark.parametrize("labels, hint", [(["0", "1"], "StringIndexer"),
                                          (["cat", "dog"], "StringIndexer")])
def test_string_labels_are_refused_with_a_pointer_to_string_indexer(spark, labels, hint):
    df = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], labels[i % 2]) for i in range(8)],
                               ["features", "label"])
    clf = NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), maxEpoch=1)
    with pytest.raises(InvalidArgumentError,
                       match=rf"Column 'label' \(labelCol\) has type string.*{hint}"):
        clf.fit(df)


def test_integer_columns_side_by_side_stay_a_float_vector_but_alone_are_int64(spark):
    """featuresCols assembles numeric columns into one float vector (as VectorAssembler
    would), integer or not; through inputCols an integer scalar column is int64 ids."""
    rows, labels = id_bags(300, length=2)
    df = spark.createDataFrame([(r[0], r[1], int(c)) for r, c in zip(rows, labels)],
                               ["a", "b", "label"])
    assert df.schema["a"].dataType.simpleString() == "bigint"
    linear = NNClassifier(model=lambda: torch.nn.Linear(2, 3),
                          criterion=torch.nn.CrossEntropyLoss(), featuresCols=["a", "b"],
                          maxEpoch=1, batchSize=64, progressBar=False)
    assert linear.fit(df).transform(df.limit(5)).count() == 5
    ids = NNClassifier(model=_PairOfIds, criterion=torch.nn.CrossEntropyLoss(),
                       inputCols=["a", "b"], maxEpoch=1, batchSize=64, progressBar=False)
    assert ids.fit(df).transform(df.limit(5)).count() == 5


class _PairOfIds(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(60, 3)

    def forward(self, a, b):
        assert a.dtype == b.dtype == torch.int64 and a.ndim == 1
        return self.emb(a) + self.emb(b)


def test_transform_of_empty_batches_and_one_logit_meaning(spark):
    """An empty DataFrame transforms to an empty result; a one-logit classifier's prediction
    in transform is logit > 0, the rule validation's accuracy uses."""
    from pyspark.sql import functions as F

    df = vector_df(spark, 80).withColumn("label", (F.col("label") > 0).cast("int"))
    clf = NNClassifier(model=lambda: torch.nn.Linear(4, 1), criterion=_BinaryLoss(),
                       maxEpoch=1, batchSize=16, validationIndicatorCol="isVal",
                       progressBar=False)
    model = clf.fit(df)
    assert model.transform(df.filter("false")).count() == 0
    out = model.transform(df).select("features", "label", "prediction", "probability").toPandas()
    with torch.no_grad():
        logits = model.module(torch.tensor(np.stack(out["features"].map(
            lambda v: v.toArray()).to_numpy()), dtype=torch.float32)).reshape(-1).numpy()
    np.testing.assert_array_equal(out["prediction"].to_numpy(), (logits > 0).astype(float))
    val = out[df.select("isVal").toPandas()["isVal"].to_numpy()]
    val_logits = logits[df.select("isVal").toPandas()["isVal"].to_numpy()]
    expected = float(((val_logits > 0).astype(int) == val["label"].to_numpy()).mean())
    reported = model.summary["validation_Top1Accuracy"].iloc[-1]
    assert reported == pytest.approx(expected, abs=1e-12)


class _BinaryLoss(torch.nn.Module):
    def forward(self, logit, target):
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logit.reshape(-1), target.to(logit.dtype))
