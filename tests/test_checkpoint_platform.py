"""A checkpoint records the numeric platform that wrote it; a resume on another one says so.

The fit identity leaves the machine out (a checkpoint carried to other hardware is still its
fit's), but the kernels' rounding is the machine's: a resume there continues the checkpoint's
weights exactly and then rounds as the new platform does. These fits run in process
(LocalPartitions), as the golden checkpoint's does.
"""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from models import SmallNet, bitwise_equal, classification_data
from sparkdl import DistriOptimizer
from sparkdl.engine.fit.resume.numeric_platform import numeric_platform, platform_differences
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import EveryEpoch, MaxEpoch

X, Y = classification_data(24, d=6, seed=5)
DATA = LocalPartitions([list(zip(X[:12], Y[:12])), list(zip(X[12:], Y[12:]))])


def _fit(epochs: int) -> DistriOptimizer:
    torch.manual_seed(4)
    net = SmallNet()
    return DistriOptimizer(net, DATA, torch.nn.CrossEntropyLoss(),
                           torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                           batch_size=6, end_trigger=MaxEpoch(epochs), seed=2, progress_bar=False)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A clean 2-epoch fit and the directory of its checkpoint after epoch 1."""
    directory = tmp_path_factory.mktemp("epoch-1")
    _fit(1).set_checkpoint(str(directory), EveryEpoch()).optimize()
    return _fit(2).optimize(), directory


def _resume(written, tmp_path, caplog, edit):
    """Resume a copy of the epoch-1 checkpoint, its state changed by ``edit``, to 2 epochs."""
    model, source = written
    directory = tmp_path / "copy"
    shutil.copytree(source, directory)
    path = next(directory.glob("checkpoint-*.pt"))
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    resumed = _fit(2).set_checkpoint(str(directory), EveryEpoch())
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        resumed.optimize()
    assert [r.iteration for r in resumed.summary.iterations] == list(range(1, 9))
    assert bitwise_equal(resumed.model, model)
    return path, [r for r in caplog.records if "numeric platform" in r.getMessage()
                  or "record the platform" in r.getMessage()]


def test_a_checkpoint_records_the_platform_and_resumes_on_it_without_a_note(written, tmp_path,
                                                                            caplog):
    state = torch.load(next(written[1].glob("checkpoint-*.pt")), weights_only=True)
    assert state["platform"] == numeric_platform()
    assert set(state["platform"]) == {"torch", "machine", "cpu", "cpu_capability", "blas",
                                      "mkl_cbwr"}
    assert state["platform"]["torch"] == torch.__version__
    _, notes = _resume(written, tmp_path, caplog, lambda state: None)
    assert notes == []


def test_a_resume_on_another_platform_warns_naming_what_differs(written, tmp_path, caplog):
    def elsewhere(state):
        state["platform"] = {**state["platform"], "cpu": "Some Other CPU", "mkl_cbwr": "AVX2",
                             "newer_field": "x"}

    path, notes = _resume(written, tmp_path, caplog, elsewhere)
    here = numeric_platform()
    assert [(r.levelno, r.getMessage()) for r in notes] == [(
        logging.WARNING,
        f"the checkpoint {path} was written on another numeric platform: cpu 'Some Other CPU' "
        f"(here {here['cpu']!r}); mkl_cbwr 'AVX2' (here {here['mkl_cbwr']!r}). The fit "
        "continues from its weights exactly, but this platform's kernels round differently, so "
        "the weights from here on can differ in their last bits from a fit trained on either "
        "platform throughout")]


def test_a_checkpoint_without_a_platform_record_resumes_with_a_note(written, tmp_path, caplog):
    path, notes = _resume(written, tmp_path, caplog, lambda state: state.pop("platform"))
    assert [(r.levelno, r.getMessage()) for r in notes] == [(
        logging.INFO,
        f"the checkpoint {path} does not record the platform it was written on (an earlier "
        "sparkdl wrote it): if that was other hardware or another torch, the weights from here "
        "on can differ in their last bits from a fit trained on one platform throughout")]


def test_platform_differences_compare_what_both_record():
    here = {"torch": "2.13.0+cpu", "cpu": "A", "blas": "mkl"}
    assert platform_differences(here, dict(here)) == []
    assert platform_differences({**here, "cpu": "B", "only_theirs": "1"},
                                {**here, "only_ours": "2"}) == ["cpu 'B' (here 'A')"]
