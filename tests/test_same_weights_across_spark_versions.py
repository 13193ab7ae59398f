"""The same training on two pyspark versions gives bitwise the same weights.

Run by ``.ci/run``'s pyspark 3.5 block, with ``SPARKDL_OTHER_PYTHON`` naming the newest
pyspark's interpreter (the README suite's venv): each interpreter trains
``spark_version_job.py`` in its own process and the saved state dicts are compared. The
README suite (one venv) does not collect this file (``conftest.collect_ignore``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from conftest import TESTS_DIR


def _train(python: str, out: str) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=python)
    subprocess.run([python, os.path.join(TESTS_DIR, "spark_version_job.py"), out], env=env,
                   check=True, timeout=600)
    return torch.load(out, weights_only=False)


def test_same_weights_across_spark_versions(tmp_path):
    here = _train(sys.executable, str(tmp_path / "here.pt"))
    other = _train(os.environ["SPARKDL_OTHER_PYTHON"], str(tmp_path / "other.pt"))
    assert here["pyspark"].split(".")[:2] != other["pyspark"].split(".")[:2], \
        (here["pyspark"], other["pyspark"])
    for part in ("engine", "estimator"):
        assert here[part].keys() == other[part].keys()
        for name, tensor in here[part].items():
            assert torch.equal(tensor, other[part][name]), \
                f"{part} {name} differs between pyspark {here['pyspark']} and {other['pyspark']}"
    for column in ("raw", "probability"):     # transform's outputs
        assert torch.equal(here[column], other[column]), column
    assert not torch.equal(here["engine"]["0.weight"], _initial_conv_weight())   # it trained


def _initial_conv_weight() -> torch.Tensor:
    from spark_version_job import cnn

    return cnn()[0].weight.detach()
