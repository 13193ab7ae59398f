"""Faults in a pass (several fits in one sequence of jobs): a killed executor and a killed
driver recover every fit bitwise, as a single fit does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fit_set_job
from models import SmallNet, bitwise_equal, kill_driver_after_first_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def clean_pass(sc):
    from sparkdl import FitSet

    fits = fit_set_job.fits(sc)
    FitSet(fits).run()
    return [f.model for f in fits]


def load_models(path) -> list[SmallNet]:
    models = []
    for state in torch.load(path, weights_only=True):
        model = SmallNet()
        model.load_state_dict(state)
        models.append(model)
    return models


def job(*args: str) -> list[str]:
    return [sys.executable, os.path.join(HERE, "fit_set_job.py"), *args]


@pytest.mark.cluster
def test_an_executor_killed_mid_pass_leaves_every_fit_bitwise(clean_pass, tmp_path):
    out, marker = tmp_path / "weights.pt", tmp_path / "marker"
    proc = subprocess.run(job("local-cluster[2,1,1024]", str(out), "--fault", "executor",
                              "--marker", str(marker)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert marker.exists(), "no executor was killed"
    assert "rebuilding all 4 of them from the RDD lineage" in proc.stderr
    assert "passes=[[0, 1, 2]] jobs=10" in proc.stdout
    for k, (model, clean) in enumerate(zip(load_models(out), clean_pass)):
        assert bitwise_equal(model, clean), k


@pytest.mark.cluster
def test_a_driver_killed_mid_pass_resumes_every_fit_bitwise(clean_pass, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "weights.pt"
    cmd = job("local[2]", str(out), "--checkpoint", str(ckpt))
    kill_driver_after_first_checkpoint(cmd, ckpt)
    assert not out.exists()
    fit_dirs = sorted(os.listdir(ckpt))     # each fit its own; the kill may come before a
    assert fit_dirs and all(d.startswith("fit-") for d in fit_dirs), fit_dirs   # fit wrote
    written = [d for d in fit_dirs
               if any(f.startswith("checkpoint-") for f in os.listdir(ckpt / d))]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert second.stderr.count("resuming from checkpoint") == len(written) >= 1, \
        second.stderr[-4000:]
    assert "iterations=8,8,10" in second.stdout
    for k, (model, clean) in enumerate(zip(load_models(out), clean_pass)):
        assert bitwise_equal(model, clean), k
