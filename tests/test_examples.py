"""The examples run as users run them: ``spark-submit --master local[2] examples/NAME.py``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spark_submit(script, *args, timeout=900):
    submit = shutil.which("spark-submit", path=os.path.dirname(sys.executable)) or "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run([submit, "--master", "local[2]",
                           "--conf", "spark.ui.enabled=false",
                           os.path.join(ROOT, "examples", script), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


EXAMPLES = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))


def metric(proc) -> float:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(re.search(r"test accuracy: ([0-9.]+)", proc.stdout).group(1))


@pytest.mark.parametrize("script", EXAMPLES)
def test_examples_have_help(script):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout


@pytest.mark.usefixtures("fashion_mnist")
def test_engine_example_under_spark_submit_with_checkpoints(tmp_path):
    args = ["--train-samples", "6000", "--epochs", "2", "--checkpoint-dir", str(tmp_path / "ck")]
    proc = spark_submit("lenet_fashion_mnist_engine.py", *args, "--min-accuracy", "0.6")
    assert metric(proc) >= 0.6
    assert "validation after iteration" in proc.stdout + proc.stderr
    written = sorted(os.listdir(tmp_path / "ck"))
    assert [f for f in written if f.startswith("checkpoint-")] == [
        "checkpoint-0000000024.pt", "checkpoint-0000000048.pt"]
    # append-only summary parts, named by iteration and content hash
    assert [f[:18] for f in written if f.startswith("summary-")] == [
        "summary-0000000024", "summary-0000000048"]


@pytest.mark.usefixtures("fashion_mnist")
def test_dataframe_lenet_example_reaches_its_target(tmp_path):
    """The example on all 60,000 images for 2 of its 8 epochs (CI's time): test accuracy >= 0.84
    (0.8628 on 2026-11-26; 3 epochs gave 0.8697 and 0.8592 in venvs built a day apart, the same
    code and seed; the README's 8-epoch figure, 0.898, is not rerun in CI)."""
    proc = spark_submit("lenet_fashion_mnist_dataframe.py", "--epochs", "2", "--model-dir",
                        str(tmp_path / "m"), "--min-accuracy", "0.84", timeout=2400)
    assert metric(proc) >= 0.84
    log = proc.stdout + proc.stderr
    assert "Top1Accuracy" in log and "epoch 2/2 118/118 " in log
    assert "weights.pt" in os.listdir(tmp_path / "m")


def test_adult_census_pipeline_example():
    assert metric(spark_submit("adult_census_pipeline.py", "--min-accuracy", "0.84")) >= 0.84


@pytest.mark.parametrize("script, epochs, name, plausible", [
    ("movielens_recommender.py", 1, "rmse", lambda v: v < 1.1),
    ("movielens_history.py", 2, "auc", lambda v: v > 0.6),
    ("movielens_wide_crosses.py", 1, "rmse", lambda v: v < 1.1)])
def test_movielens_examples_match_single_process_pytorch(script, epochs, name, plausible):
    """Real ids and sequences (MovieLens, time-based split): sparkdl's test metric within 2%
    of plain single-process PyTorch trained with the same recipe (1 or 2 epochs: the sequence
    model's AUC is barely above chance after 1; the README's figures for the first two are at
    4)."""
    extra = ["--dense-share", "0.03"] if script == "movielens_wide_crosses.py" else []
    proc = spark_submit(script, "--epochs", str(epochs), *extra, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = re.search(rf"test {name}: ([0-9.]+) \(single-process PyTorch, same recipe: "
                      r"([0-9.]+); gap", proc.stdout)
    assert found, proc.stdout
    ours, single = float(found.group(1)), float(found.group(2))
    assert abs(ours - single) / single <= 0.02, (ours, single)
    assert plausible(ours) and plausible(single), (ours, single)
    if script == "movielens_wide_crosses.py":    # timed beside the dense way (not asserted)
        assert re.search(r"seconds per iteration: [0-9.]+ with sparse tables and row deltas, "
                         r"[0-9.]+ the dense way", proc.stdout), proc.stdout


def test_transformer_example_trains_a_huggingface_model_with_its_own_loss():
    """Hugging Face BERT from a config, titles tokenised in Spark, trainingStep: sparkdl's test
    accuracy next to single-process PyTorch with the same step and recipe (2 epochs here)."""
    proc = spark_submit("movielens_title_transformer.py", "--epochs", "2", "--max-gap", "0.05",
                        timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = re.search(r"test accuracy: ([0-9.]+) \(single-process PyTorch, same recipe: "
                      r"([0-9.]+); gap", proc.stdout)
    assert found, proc.stdout
    ours, single = float(found.group(1)), float(found.group(2))
    assert abs(ours - single) / single <= 0.05 and min(ours, single) > 0.5, (ours, single)


def test_lora_example_fine_tunes_saves_the_adapter_and_a_second_job_scores_with_it(tmp_path):
    """The LoRA example end to end: a base saved to disk, a Parquet table of texts, LoRA with
    NNClassifier, held-out accuracy, the adapter saved (peft's files, no base weights); then
    the scoring job reloads it and scores the new rows as the training job's model did."""
    import pandas as pd

    work = str(tmp_path / "lora")
    trained = spark_submit("lora_text_classifier.py", "--work-dir", work)
    assert metric(trained) >= 0.8         # 0.8961 on 2026-12-01 (800 rows, 4 epochs)
    saved = set(os.listdir(os.path.join(work, "adapter")))
    assert {"adapter_config.json", "adapter_model.safetensors", "sparkdl_base.json"} <= saved
    assert "weights.pt" not in saved
    scored = spark_submit("lora_text_classifier.py", "--work-dir", work, "--score")
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "scored rows: 200" in scored.stdout

    def table(name):
        return pd.read_parquet(os.path.join(work, name)).sort_values(
            ["text", "prob_positive"]).reset_index(drop=True)

    here, there = table("holdout_predictions"), table("scored")
    assert len(here) == 200 and here["text"].tolist() == there["text"].tolist()
    assert (here["prediction"] == there["prediction"]).all()
    assert (here["prob_positive"] - there["prob_positive"]).abs().max() <= 1e-6
