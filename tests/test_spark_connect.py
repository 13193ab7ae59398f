"""The estimators under Spark Connect (issue 16), against the classic path.

tests/connect_job.py runs the Connect side in a process of its own (a local Connect server
next to this process's classic session is untried); this module runs the same fits on the
classic session and compares: the same seed and partitioning must give bitwise the same
weights. Needs pyspark's connect extra (installed by the test extras): an ImportError here is
a failure, not a skip.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import connect_job as job

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _run_phase(data_dir, out, phase):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(TESTS_DIR), TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "connect_job.py"), data_dir,
                           out, "--phase", phase], env=env, capture_output=True, text=True,
                          timeout=1200)
    path = os.path.join(out, f"results-{phase}.json")
    assert proc.returncode == 0 and os.path.exists(path), (proc.stdout[-3000:] +
                                                           proc.stderr[-6000:])
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def connect_run(spark, tmp_path_factory):
    importlib.import_module("grpc_status")   # the connect extra: missing fails, never skips

    root = tmp_path_factory.mktemp("connect")
    data_dir, out = str(root / "data"), str(root / "out")
    job.write_data(spark, data_dir)
    results = _run_phase(data_dir, out, "main")
    assert results["connect"] == "pyspark.sql.connect.session"
    return data_dir, out, results


@pytest.fixture(scope="module")
def fills_run(connect_run):
    """The fills phase: a server whose Python workers are never reused (its own process)."""
    data_dir, out, _ = connect_run
    return data_dir, out, _run_phase(data_dir, out, "fills")


def _weights(out, name):
    return torch.load(os.path.join(out, name), weights_only=True)


def bitwise_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_classifier_fit_and_transform_equal_the_classic_path(spark, connect_run, tmp_path):
    data_dir, out, results = connect_run
    model = job.fit_classifier(spark, data_dir, str(tmp_path / "ckpt"))
    assert bitwise_equal(model.state_dict(), _weights(out, "classifier.pt"))
    curves = model.summary.drop(columns=["seconds"]).to_dict(orient="list")
    assert curves == {k: v for k, v in results["classifier_summary"].items() if k != "seconds"}
    df = spark.read.parquet(f"{data_dir}/clf")
    np.testing.assert_array_equal(job.predictions(model, df),
                                  np.load(os.path.join(out, "classifier_pred.npy")))
    # checkpoints written through pyarrow.fs, one per epoch, as on the classic path
    assert results["checkpoints"] == sorted(os.listdir(tmp_path / "ckpt"))


def test_regressor_with_feature_columns_equals_the_classic_path(spark, connect_run):
    _, out, _ = connect_run
    assert bitwise_equal(job.fit_regressor(spark, connect_run[0]).state_dict(),
                         _weights(out, "regressor.pt"))


def test_shuffle_allreduce_as_dataframe_jobs_equals_the_rdd_shuffle(spark, connect_run):
    data_dir, out, _ = connect_run
    net, _ = job.engine_shuffle(spark, data_dir, connect=False)
    assert bitwise_equal(net.state_dict(), _weights(out, "shuffle.pt"))


@pytest.mark.parametrize("path", ["driver", "shuffle"])
def test_a_pass_of_fits_under_connect_is_each_fit_alone_bitwise(spark, connect_run, path):
    """Issue 36 under Spark Connect: three fits (another lr; another batch size, seed and
    length with bf16 gradients) in one pass of DataFrame jobs, each bitwise its classic fit
    alone, in the jobs of the longest fit."""
    data_dir, out, results = connect_run
    alone, _, _ = job.engine_pass(spark, data_dir, False, path, together=False)
    together = torch.load(os.path.join(out, f"pass_{path}.pt"), weights_only=True)
    for net, state in zip(alone, together):
        assert bitwise_equal(net.state_dict(), state)
    ran = results[f"pass_{path}"]
    assert ran["passes"] == [[0, 1, 2]]
    longest = max(fit[3] for fit in job.PASS_FITS)
    assert ran["jobs"] == longest, ran          # one gradient job per iteration for all three


def test_sparse_tables_with_two_optimizers_equal_the_classic_path(spark, connect_run):
    data_dir, out, _ = connect_run
    assert bitwise_equal(job.fit_sparse_tables(spark, data_dir).state_dict(),
                         _weights(out, "sparse_tables.pt"))


def test_large_model_travels_through_the_exchange_dir_bitwise(spark, connect_run):
    data_dir, out, results = connect_run
    assert "more than the 8 MiB" in results["large_without_exchange_error"]
    assert "exchangeDir" in results["large_without_exchange_error"]
    assert results["large_log"] and "through files in the exchange directory" in \
        results["large_log"][0]
    assert results["exchange_left"] == []          # the run's files are deleted at the end
    model = job.fit_large(spark, data_dir)         # classic: no exchange directory needed
    assert bitwise_equal(model.state_dict(), _weights(out, "large.pt"))
    classic = [r[0] for r in model.transform(spark.read.parquet(f"{data_dir}/ids"))
               .select("prediction").collect()]
    np.testing.assert_array_equal(np.array(classic), np.load(os.path.join(out, "large_pred.npy")))


def test_save_overwrite_load_under_connect_and_across_sessions(spark, connect_run):
    from sparkdl import NNClassifierModel

    data_dir, out, results = connect_run
    assert "already exists" in results["save_twice_error"]
    expected = np.load(os.path.join(out, "classifier_pred.npy"))
    np.testing.assert_array_equal(np.load(os.path.join(out, "loaded_pred.npy")), expected)
    assert results["loaded_estimator_maxEpoch"] == 3
    # the same layout as a classic save: the classic session loads what Connect wrote
    loaded = NNClassifierModel.load(os.path.join(out, "saved_model"))
    df = spark.read.parquet(f"{data_dir}/clf")
    np.testing.assert_array_equal(job.predictions(loaded, df), expected)


def test_pipeline_and_cross_validator_under_connect(spark, connect_run):
    data_dir, out, results = connect_run
    pred = np.load(os.path.join(out, "pipeline_pred.npy"))
    np.testing.assert_array_equal(np.load(os.path.join(out, "pipeline_loaded_pred.npy")), pred)
    df = spark.read.parquet(f"{data_dir}/clf").toPandas().sort_values("id")
    assert (pred == df["label"].to_numpy()).mean() > 0.6
    assert results["cv_best_type"] == "NNClassifierModel"
    classic = job.cross_validate(spark, data_dir)
    assert [float(m) for m in classic.avgMetrics] == results["cv_metrics"]


def test_bad_input_and_the_engine_api_give_clear_errors_under_connect(connect_run):
    _, _, results = connect_run
    assert results["string_label_error"].startswith("InvalidArgumentError: Column 'text_label'")
    assert "StringIndexer" in results["string_label_error"]
    assert results["missing_column_error"].startswith(
        "InvalidArgumentError: Column 'nope' (featuresCol) does not exist")
    assert "Spark Connect DataFrame" in results["engine_api_error"]
    assert "sparkdl.NNEstimator" in results["engine_api_error"]


def test_missing_shards_are_filled_and_the_result_is_unchanged(spark, fills_run):
    """A server whose Python workers are never reused and keep shards in memory only: every
    task misses its shard, fill jobs build it, and the weights are still the classic ones.
    Shard replicas asked for there are refused with a warning (Connect cannot place tasks)."""
    data_dir, out, results = fills_run
    assert results["fills_misses"] >= 2 * 2            # every partition of every iteration
    # spark.sparkdl.shardReplicas=2 on this server: not applied, and each fit says so
    said = results["replicas_said"]
    assert said and all("spark.sparkdl.shardReplicas=2 is not applied under Spark Connect" in m
                        for m in said), said
    assert results["fills_rebuilt"] == results["fills_misses"]
    net, _ = job.engine_shuffle(spark, data_dir, connect=False, iterations=2)
    assert bitwise_equal(net.state_dict(), _weights(out, "fills_shuffle.pt"))
    # a pass whose tasks all miss their shards: filled, each fit still bitwise alone
    alone, _, _ = job.engine_pass(spark, data_dir, False, "shuffle", together=False,
                                  fits=job.FILLS_PASS_FITS)
    together = torch.load(os.path.join(out, "fills_pass.pt"), weights_only=True)
    for net, state in zip(alone, together):
        assert bitwise_equal(net.state_dict(), state)
    assert results["fills_pass"]["passes"] == [[0, 1]]
    model = job.fit_classifier(spark, data_dir, "", epochs=1, batch_size=144)
    assert bitwise_equal(model.state_dict(), _weights(out, "fills_classifier.pt"))
