"""Variable-length inputs (issue: the DataFrame API for real data, acceptance 3): stored as
values plus offsets, padded per task batch to its longest row; equal to single-process PyTorch
fed the same batches padded; a shard's memory follows the number of elements."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from df_helpers import SequenceMeanNet, id_sequences
from models import make_rdd, max_abs_diff
from sparkdl import BatchPlan, DistriOptimizer, NNClassifier
from sparkdl.data.ragged import Ragged
from sparkdl.executor import shard_store
from sparkdl.triggers import MaxIteration

SIZES, BATCH, SEED = [70, 50, 80], 32, 2


def test_ragged_rdd_records_train_like_single_process_on_padded_batches(sc):
    rows, labels = id_sequences(sum(SIZES))
    torch.manual_seed(4)
    net = SequenceMeanNet()
    reference = copy.deepcopy(net)
    records = [((np.asarray(r, dtype=np.int64),), int(c)) for r, c in zip(rows, labels)]
    opt = DistriOptimizer(net, make_rdd(sc, records, SIZES), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.5), batch_size=BATCH,
                          end_trigger=MaxIteration(12), seed=SEED, sequence_inputs=[0],
                          padding_value=0, progress_bar=False)
    opt.optimize()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    for t in range(12):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        padded, lengths = Ragged.from_rows([rows[i] for i in idx], np.int64).pad(0)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(
            reference(torch.from_numpy(padded), torch.from_numpy(lengths)),
            torch.from_numpy(labels[idx])).backward()
        optimizer.step()
    assert max_abs_diff(net, reference) < 1e-6
    assert max_abs_diff(net, SequenceMeanNet()) > 1e-2     # it trained


def test_a_ragged_shard_takes_the_memory_of_its_elements():
    rows, labels = id_sequences(500, max_len=40)
    records = [((np.asarray(r, dtype=np.int64),), int(c)) for r, c in zip(rows, labels)]
    summary = shard_store.build_shard("ragged-memory", 0, records, "float32", "memory", (0,))
    try:
        shard = shard_store.open_shard("ragged-memory", 0)
        ids = shard.features[0]
        assert isinstance(ids, Ragged) and summary.feature_shapes == [(-1,)]
        elements = sum(len(r) for r in rows) * 8
        assert ids.nbytes <= 1.10 * elements, (ids.nbytes, elements)
        assert 40 * len(rows) * 8 > 1.5 * elements       # padding would cost far more
        for i in (0, 7, 499):
            np.testing.assert_array_equal(ids.take(np.array([i])).values, rows[i])
    finally:
        shard_store.drop_run("ragged-memory")


def test_sequence_cols_through_the_classifier_with_save_and_load(spark, tmp_path):
    from sparkdl import NNClassifierModel

    rows, labels = id_sequences(600)
    users = np.arange(600) % 7
    df = spark.createDataFrame([(int(u), [int(i) for i in r], int(c))
                                for u, r, c in zip(users, rows, labels)],
                               ["user", "history", "label"])
    clf = NNClassifier(model=lambda: SequenceMeanNet(extra=7),
                       criterion=torch.nn.CrossEntropyLoss(), inputCols=["user", "history"],
                       sequenceCols=["history"], maxEpoch=12, batchSize=64, learningRate=0.02,
                       seed=0, progressBar=False)
    model = clf.fit(df)
    out = model.transform(df).select("label", "prediction").toPandas()
    assert float((out["label"] == out["prediction"]).mean()) >= 0.95
    model.write().overwrite().save(str(tmp_path / "m"))
    again = NNClassifierModel.load(str(tmp_path / "m"))
    assert again.getSequenceCols() == ["history"]
    b = again.transform(df).select("prediction").toPandas()["prediction"]
    np.testing.assert_array_equal(out["prediction"].to_numpy(), b.to_numpy())


def test_collate_builds_the_model_arguments_itself(spark, tmp_path):
    rows, labels = id_sequences(200)
    df = spark.createDataFrame([([int(i) for i in r], int(c)) for r, c in zip(rows, labels)],
                               ["ids", "label"])
    seen = []

    def collate(inputs):
        (ids,) = inputs
        assert isinstance(ids, Ragged)
        seen.append(len(ids))
        return ids.pad(-1)[0] + 1, ids.lengths()      # ids shifted by one, 0 pads

    clf = NNClassifier(model=lambda: SequenceMeanNet(vocab=61),
                       criterion=torch.nn.CrossEntropyLoss(), featuresCol="ids",
                       sequenceCols=["ids"], collate=collate, maxEpoch=1, batchSize=50,
                       augment=lambda batch, rng: batch, progressBar=False)
    clf.write().overwrite().save(str(tmp_path / "est"))
    assert NNClassifier.load(str(tmp_path / "est")).collate is not None
    model = clf.fit(df)
    assert model.transform(df).count() == 200
    assert seen, "collate ran in the driver's checks"


def test_sequence_col_that_is_not_an_input_is_refused(spark):
    from sparkdl import InvalidArgumentError

    df = spark.createDataFrame([([1, 2], 0)], ["ids", "label"])
    clf = NNClassifier(model=SequenceMeanNet, criterion=torch.nn.CrossEntropyLoss(),
                       featuresCol="ids", sequenceCols=["other"])
    with pytest.raises(InvalidArgumentError, match=r"Column 'other' \(in sequenceCols\) is "
                                                   r"not one of the model's input columns"):
        clf.fit(df)


def test_sequences_pass_through_augmentation_and_concatenate_from_any_offset():
    from sparkdl.data.batch_plan import transform_generator
    from sparkdl.executor.step import apply_transform

    seqs = Ragged.from_rows([np.array([3, 1, 4]), np.array([1]), np.array([5, 9])])
    out = apply_transform(lambda batch, rng: batch, [seqs], transform_generator(0, 0, 0))
    assert isinstance(out[0], Ragged)
    shifted = Ragged(np.array([9, 9, 1, 2, 3]), np.array([2, 3, 5]))   # rows [1], [2, 3]
    both = Ragged.concatenate([shifted, seqs])
    rows = [both.take(np.array([i])).values.tolist() for i in range(len(both))]
    assert rows == [[1], [2, 3], [3, 1, 4], [1], [5, 9]]
