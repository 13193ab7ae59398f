"""From a table to a table: the Adult census training job and the scoring job run as separate
``spark-submit`` processes that share a Derby metastore (examples/adult_census_tables.py,
examples/adult_census_scoring.py), on the real data, 1 epoch.

The managed tables live in the jobs' warehouse folder, one Parquet folder per table; this
suite's own session (no metastore) reads them there."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from pyspark.sql import functions as F

from test_examples import ROOT, spark_submit

from sparkdl.datasets.adult import ADULT_COLUMNS

TABLE_COLUMNS = ["id", *ADULT_COLUMNS[:-1], "label"]
PREDICTION_COLUMNS = TABLE_COLUMNS + ["prediction", "prob_over_50k"]
ADULT_TRAIN_ROWS, ADULT_TEST_ROWS = 32561, 16281


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Runs the training job (preparing the tables, reading the Parquet copy of the training
    split), then the scoring job on the test split's catalog table."""
    root = tmp_path_factory.mktemp("tables")
    catalog, model = str(root / "catalog"), str(root / "model")
    train = spark_submit("adult_census_tables.py", "--catalog-dir", catalog,
                         "--prepare", str(root / "parquet"),
                         "--input", str(root / "parquet" / "adult_train"),
                         "--model-dir", model, "--epochs", "1", timeout=600)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    score = spark_submit("adult_census_scoring.py", "--catalog-dir", catalog,
                         "--table", "adult_test", "--model-dir", model,
                         "--output-table", "adult_test_scored", timeout=600)
    assert score.returncode == 0, score.stdout[-2000:] + score.stderr[-3000:]
    return {"warehouse": os.path.join(catalog, "warehouse"), "model": model,
            "parquet": str(root / "parquet"), "train": train, "score": score}


def _scored_here(model_dir, rows) -> list[tuple]:
    """(id, prediction, P(>50K)) of ``rows`` by the saved PipelineModel, loaded in this
    process, in id order."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.functions import vector_to_array

    scored = PipelineModel.load(model_dir).transform(rows).select(
        "id", "prediction", vector_to_array(F.col("probability"))[1].alias("prob_over_50k"))
    return sorted(tuple(r) for r in scored.collect())


def _accuracy_and_majority(rows) -> tuple[float, float]:
    labels = [r["label"] for r in rows]
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
    positive = sum(labels) / len(labels)
    return accuracy, max(positive, 1.0 - positive)


def test_training_job_writes_the_holdout_predictions_table(jobs, spark):
    table = spark.read.parquet(os.path.join(jobs["warehouse"], "adult_holdout_predictions"))
    assert table.columns == PREDICTION_COLUMNS
    rows = table.collect()
    train_ids = {r["id"] for r in spark.read.parquet(
        os.path.join(jobs["parquet"], "adult_train")).select("id").collect()}
    assert len(train_ids) == ADULT_TRAIN_ROWS
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids) and set(ids) <= train_ids
    assert 0.18 * ADULT_TRAIN_ROWS < len(rows) < 0.22 * ADULT_TRAIN_ROWS     # --holdout 0.2
    assert all(r["prediction"] == float(r["prob_over_50k"] > 0.5) for r in rows)
    accuracy, majority = _accuracy_and_majority(rows)
    printed = re.search(r"holdout accuracy: ([0-9.]+), area under ROC: ([0-9.]+)",
                        jobs["train"].stdout)
    assert printed, jobs["train"].stdout[-2000:]
    assert float(printed.group(1)) == pytest.approx(accuracy, abs=5e-5)
    # About 76% earn <=50K: the model must do clearly better than always saying so.
    assert 0.74 < majority < 0.78 and accuracy > majority + 0.05, (accuracy, majority)
    assert float(printed.group(2)) > 0.85
    # The saved model, loaded here, predicts what the training job's fitted model did.
    held_out = spark.read.parquet(os.path.join(jobs["parquet"], "adult_train")).where(
        F.col("id").isin(ids))
    assert _scored_here(jobs["model"], held_out) == [
        (r["id"], r["prediction"], r["prob_over_50k"]) for r in sorted(rows, key=lambda r: r["id"])]


def test_scoring_job_scores_the_new_table_as_the_saved_model_does_here(jobs, spark):
    scored = spark.read.parquet(os.path.join(jobs["warehouse"], "adult_test_scored"))
    assert scored.columns == PREDICTION_COLUMNS
    theirs = sorted(scored.collect(), key=lambda r: r["id"])
    assert [r["id"] for r in theirs] == list(range(ADULT_TEST_ROWS))
    # The catalog table the training job's preparation wrote, read by the second process.
    new_rows = spark.read.parquet(os.path.join(jobs["warehouse"], "adult_test"))
    assert [(r["id"], r["prediction"], r["prob_over_50k"]) for r in theirs] == \
        _scored_here(jobs["model"], new_rows)
    accuracy, majority = _accuracy_and_majority(theirs)
    assert accuracy > majority + 0.05, (accuracy, majority)
    assert f"accuracy on the new rows: {accuracy:.4f}" in jobs["score"].stdout


def test_scoring_job_names_a_missing_model_folder(tmp_path):
    missing = str(tmp_path / "no-model")
    script = os.path.join(ROOT, "examples", "adult_census_scoring.py")
    proc = subprocess.run([sys.executable, script, "--table", "adult_test", "--model-dir", missing,
                           "--catalog-dir", str(tmp_path / "catalog")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--model-dir {missing}: no saved PipelineModel there" in proc.stderr
    assert not os.path.exists(tmp_path / "catalog")        # refused before any Spark work
