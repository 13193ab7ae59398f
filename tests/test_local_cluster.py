"""Acceptance 4: the engine runs on local[2] and on local-cluster[2,1,1024] (two executor JVMs),
with the same weights bitwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import cluster_job
from models import SmallNet, bitwise_equal

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.cluster
def test_local_cluster_gives_the_same_weights_as_local(sc, tmp_path):
    out = tmp_path / "weights.pt"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cluster_job.py"),
                           "local-cluster[2,1,1024]", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "executors=2" in proc.stdout
    on_cluster = SmallNet()
    on_cluster.load_state_dict(torch.load(out, weights_only=True))
    local = cluster_job.train(sc)
    assert bitwise_equal(on_cluster, local)
