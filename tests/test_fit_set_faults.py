"""Faults in a set of fits, trained in one pass or by model hopping: a killed executor and a
killed driver recover every fit bitwise, as a single fit does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import cluster_scenarios
import fit_set_job
from models import SmallNet, bitwise_equal, kill_driver_after_first_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
STRATEGIES = ["together", "hop"]


@pytest.fixture(scope="module")
def clean_runs(sc):
    """Each strategy's uninterrupted run on local[2], trained once when first asked."""
    from sparkdl import FitSet

    runs: dict[str, list[torch.nn.Module]] = {}

    def clean(strategy: str) -> list[torch.nn.Module]:
        if strategy not in runs:
            fits = fit_set_job.fits(sc)
            FitSet(fits, strategy=strategy).run()
            runs[strategy] = [f.model for f in fits]
        return runs[strategy]

    return clean


def load_models(path) -> list[SmallNet]:
    models = []
    for state in torch.load(path, weights_only=True):
        model = SmallNet()
        model.load_state_dict(state)
        models.append(model)
    return models


def job(master: str, out_dir, *args: str) -> list[str]:
    return [sys.executable, os.path.join(HERE, "fit_set_job.py"), master, str(out_dir), *args]


@pytest.fixture(scope="module")
def executor_killed(tmp_path_factory):
    """One local-cluster[2,1,1024] driver trains together, then hop, each killing an executor
    once (its own marker); the job's output and its directory of markers and weights."""
    out = tmp_path_factory.mktemp("executor-killed")
    proc = subprocess.run(job("local-cluster[2,1,1024]", out, "--fault", "executor",
                              "--strategy", *STRATEGIES),
                          capture_output=True, text=True, timeout=900)
    return proc, out


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_executor_killed_mid_job_leaves_every_fit_bitwise(clean_runs, executor_killed,
                                                             strategy):
    """together: mid-pass; hop: mid-sub-epoch (the job runs again from the states the driver
    kept)."""
    proc, out = executor_killed
    assert proc.returncode == 0, proc.stderr[-4000:]
    part = cluster_scenarios.section(proc.stdout, proc.stderr, strategy)
    assert part.status == "ok", part.stderr[-4000:]
    stdout, stderr = part.stdout, part.stderr
    assert (out / f"{strategy}.marker").exists(), "no executor was killed"
    assert "rebuilding all 4 of them from the RDD lineage" in stderr, stderr[-4000:]
    if strategy == "together":
        assert "passes=[[0, 1, 2]] jobs=10" in stdout
    assert "iterations=8,8,10" in stdout
    for k, (model, clean) in enumerate(zip(load_models(out / f"{strategy}.pt"),
                                           clean_runs(strategy))):
        assert bitwise_equal(model, clean), k


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_driver_killed_after_a_checkpoint_resumes_every_fit_bitwise(clean_runs, tmp_path,
                                                                     strategy):
    """together: checkpoints every 2 iterations; hop: every 2 sub-epochs."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    cmd = job("local[2]", out, "--checkpoint", str(ckpt), "--strategy", strategy)
    kill_driver_after_first_checkpoint(cmd, ckpt)
    assert not (out / f"{strategy}.pt").exists()
    fit_dirs = sorted(os.listdir(ckpt / strategy))  # each fit its own; the kill may come
    assert fit_dirs and all(d.startswith("fit-") for d in fit_dirs), fit_dirs  # before a fit
    written = [d for d in fit_dirs                                             # wrote
               if any(f.startswith("checkpoint-") for f in os.listdir(ckpt / strategy / d))]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert second.stderr.count("resuming from checkpoint") == len(written) >= 1, \
        second.stderr[-4000:]
    assert "iterations=8,8,10" in second.stdout
    for k, (model, clean) in enumerate(zip(load_models(out / f"{strategy}.pt"),
                                           clean_runs(strategy))):
        assert bitwise_equal(model, clean), k
