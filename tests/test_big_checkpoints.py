"""A checkpoint above 250 MB is written and resumed bitwise on a default 1 GiB driver (issue 22,
acceptance 3): checkpoint files travel through py4j in chunks of a few MiB, never as one string
(one ~260 MB py4j call failed before)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from models import bitwise_equal

HERE = os.path.dirname(os.path.abspath(__file__))


def run(*args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "big_checkpoint_job.py"), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.cluster
def test_a_checkpoint_above_250_mb_is_written_and_resumed_bitwise(tmp_path):
    ckpt = tmp_path / "ckpt"
    run(str(tmp_path / "whole.pt"), "3", str(ckpt))    # uninterrupted; checkpoint at iteration 2
    files = [f for f in os.listdir(ckpt) if f.startswith("checkpoint-")]
    assert files == ["checkpoint-0000000002.pt"]
    assert os.path.getsize(ckpt / files[0]) > 250e6
    log = run(str(tmp_path / "resumed.pt"), "3", str(ckpt))   # a new driver resumes at 2
    assert "resuming from checkpoint" in log and "0000000002.pt: iteration 2," in log, log[-2000:]
    resumed, whole = (torch.nn.Linear(2400, 9000) for _ in range(2))
    resumed.load_state_dict(torch.load(tmp_path / "resumed.pt", weights_only=True))
    whole.load_state_dict(torch.load(tmp_path / "whole.pt", weights_only=True))
    assert bitwise_equal(resumed, whole)
    at_two = torch.nn.Linear(2400, 9000)        # the checkpoint's weights: iteration 3 trained
    at_two.load_state_dict(torch.load(ckpt / files[0], weights_only=False)["model_state"])
    assert not bitwise_equal(at_two, whole)
