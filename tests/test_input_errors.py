"""Acceptance 5: bad input gets a clear error naming what is wrong, before the first iteration."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models import SmallNet, bitwise_equal, classification_data, make_rdd
from sparkdl import (DistriOptimizer, InvalidArgumentError, ModelCriterionMismatchError,
                     TrainingDataError)
from sparkdl.triggers import MaxIteration


def engine(rdd, net=None, criterion=None, batch_size=4):
    net = net or SmallNet()
    return DistriOptimizer(net, rdd, criterion or torch.nn.CrossEntropyLoss(),
                           torch.optim.SGD(net.parameters(), lr=0.1), batch_size=batch_size,
                           end_trigger=MaxIteration(1))


def good_records(n=12):
    x, y = classification_data(n)
    return list(zip(x, y))


def expect_before_training(sc, records, sizes, error, match, net=None, criterion=None):
    net = net or SmallNet()
    before = copy.deepcopy(net)
    opt = engine(make_rdd(sc, records, sizes), net, criterion)
    with pytest.raises(error, match=match):
        opt.optimize()
    assert opt.summary.iterations == []
    assert bitwise_equal(net, before), "the user's model was changed by a failed run"


def test_inconsistent_feature_shapes_within_a_partition(sc):
    records = good_records()
    records[7] = (np.zeros(5, np.float32), 1)
    expect_before_training(sc, records, [6, 6], TrainingDataError,
                           r"record 1 of partition 1 has feature shape \(5,\) but the first "
                           r"record of the partition has \(6,\)")


def test_inconsistent_feature_shapes_across_partitions(sc):
    records = good_records()
    records[6:] = [(np.zeros(4, np.float32), 0)] * 6
    expect_before_training(sc, records, [6, 6], TrainingDataError,
                           r"inconsistent feature shape.*partition 0 has \[\(6,\)\].*"
                           r"partition 1 has \[\(4,\)\]")


def test_non_numeric_features(sc):
    records = good_records()
    records[2] = (np.array(["a"] * 6), 1)
    expect_before_training(sc, records, [6, 6], TrainingDataError,
                           r"features of record 2 of partition 0 is not numeric \(numpy dtype <U1")


def test_non_numeric_label(sc):
    records = good_records()
    records[3] = (records[3][0], "cat")
    expect_before_training(sc, records, [12], TrainingDataError,
                           r"label of record 3 of partition 0 is not numeric")


def test_record_that_is_not_a_pair(sc):
    records = good_records()
    records[0] = np.zeros(6, np.float32)
    expect_before_training(sc, records, [12], TrainingDataError,
                           r"record 0 of partition 0 is not a \(features, label\) pair")


@pytest.mark.parametrize("bad_label,shown", [(3, "from 0 to 3"), (-2, "from -2 to")])
def test_labels_out_of_range_for_the_criterion(sc, bad_label, shown):
    records = good_records()
    records[9] = (records[9][0], bad_label)
    expect_before_training(sc, records, [6, 6], TrainingDataError,
                           rf"class indices in 0\.\.2 for CrossEntropyLoss \(the model has 3 "
                           rf"outputs\); they range {shown}")


def test_model_output_that_does_not_fit_the_criterion(sc):
    # MSELoss would silently broadcast (n, 3) against (n,): refuse it.
    records = [(x, np.float32(y)) for x, y in good_records()]
    expect_before_training(sc, records, [12], ModelCriterionMismatchError,
                           r"MSELoss needs the model output and the label to have the same "
                           r"shape; the model returns \(4, 3\) for labels of shape \(4,\)",
                           criterion=torch.nn.MSELoss())


def test_features_the_model_cannot_take(sc):
    records = [(np.zeros(9, np.float32), 0)] * 8
    expect_before_training(sc, records, [8], ModelCriterionMismatchError,
                           r"cannot run on the training features: a batch of features of "
                           r"shape\(s\) \(4, 9\)")


def test_nan_features(sc):
    records = good_records()
    records[4] = (np.full(6, np.nan, np.float32), 0)
    expect_before_training(sc, records, [6, 6], TrainingDataError,
                           r"NaN or infinite feature values in partition\(s\) \[0\]")


def test_empty_rdd(sc):
    expect_before_training(sc, [], [0, 0], TrainingDataError,
                           r"training RDD is empty: it has 2 partition\(s\)")


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8"])
def test_bad_batch_size_is_rejected_at_construction(sc, batch_size):
    rdd = make_rdd(sc, good_records(), [12])
    with pytest.raises(InvalidArgumentError,
                       match=r"The 'batch_size' argument of DistriOptimizer must be a positive "
                             r"int\. Got"):
        engine(rdd, batch_size=batch_size)


@pytest.mark.parametrize("value,shown", [([(1, 2)], "list"), (None, "NoneType")])
def test_training_data_that_is_not_an_rdd(value, shown):
    with pytest.raises(InvalidArgumentError,
                       match=rf"'training_rdd' argument of DistriOptimizer must be a pyspark RDD "
                             rf"of \(features, label\) pairs\. Got {shown} instead"):
        engine(value)


def test_dataframe_instead_of_rdd_points_to_the_estimator(spark):
    df = spark.createDataFrame([(1.0, 0)], ["x", "label"])
    with pytest.raises(InvalidArgumentError, match=r"Got DataFrame instead\. For a DataFrame use "
                                                   r"sparkdl\.NNEstimator"):
        engine(df)


def test_optimizer_over_other_parameters(sc):
    net, other = SmallNet(), SmallNet()
    with pytest.raises(InvalidArgumentError, match=r"must be built over the model's own"):
        DistriOptimizer(net, make_rdd(sc, good_records(), [12]), torch.nn.CrossEntropyLoss(),
                        torch.optim.SGD(other.parameters(), lr=0.1), batch_size=4)


def test_criterion_without_reduction(sc):
    net = SmallNet()
    with pytest.raises(InvalidArgumentError, match=r"reduction='none'"):
        DistriOptimizer(net, make_rdd(sc, good_records(), [12]),
                        torch.nn.CrossEntropyLoss(reduction="none"),
                        torch.optim.SGD(net.parameters(), lr=0.1), batch_size=4)
