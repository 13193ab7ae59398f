"""Nothing of a finished run outlives it in the Python workers, and long runs keep their memory
flat (issue 22, acceptance 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from models import SmallNet, classification_data, make_rdd
from sparkdl import DistriOptimizer
from sparkdl.triggers import MaxIteration

HERE = os.path.dirname(os.path.abspath(__file__))


def fit_groups(tmp_path):
    """[(fits' keys, keys the workers hold)] for the evicting group, then the other."""
    out = tmp_path / "held.json"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cleanup_job.py"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(seen["fits"], {key for worker in seen["held"] for kind in worker.values()
                            for key in kind}) for seen in json.loads(out.read_text())]


@pytest.mark.cluster
def test_workers_evict_finished_runs_without_the_cleanup_job(tmp_path):
    (fits, held), (kept_fits, kept_held) = fit_groups(tmp_path)
    assert all(len(keys) == 2 for keys in fits)         # a run key and a data key per fit
    earlier = {key for keys in fits[:-1] for key in keys}
    assert not held & earlier, f"finished runs left behind: {sorted(held & earlier)}"
    assert held & set(fits[-1]), "the probe sees nothing: it could not catch leftovers"
    # the same fits with tasks that carry no live runs: the earlier fits stay (the check above
    # can fail)
    assert kept_held & {key for keys in kept_fits[:-1] for key in keys}


def test_a_long_run_keeps_driver_and_worker_memory_flat(sc):
    x, y = classification_data(64, seed=0)
    torch.manual_seed(0)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [32, 32]),
                          torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.01),
                          batch_size=8, end_trigger=MaxIteration(1200), seed=0,
                          progress_bar=False)
    opt.optimize()
    records = opt.summary.iterations
    assert len(records) == 1200
    for field in ("driver_rss_bytes", "worker_rss_bytes"):
        rss = np.array([getattr(r, field) for r in records], dtype=np.float64)
        warm, late = rss[200:400].mean(), rss[1000:].mean()
        assert late <= 1.10 * warm, f"{field}: {warm / 2**20:.0f} MiB -> {late / 2**20:.0f} MiB"
