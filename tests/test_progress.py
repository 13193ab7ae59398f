"""Progress while training: the console bar (on, off, automatic), and TensorBoard summaries."""

from __future__ import annotations

import io
import logging
import sys

import pytest
import torch

from models import SmallNet, classification_data, make_rdd
from sparkdl import DistriOptimizer, InvalidArgumentError, Top1Accuracy
from sparkdl.triggers import EveryEpoch, MaxEpoch


def engine(sc, progress_bar, epochs=2):
    x, y = classification_data(120, seed=4)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [70, 50]),
                          torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.2),
                          batch_size=40, end_trigger=MaxEpoch(epochs), progress_bar=progress_bar)
    opt.set_validation(make_rdd(sc, list(zip(x, y)), [60, 60]), EveryEpoch(), [Top1Accuracy()])
    return opt


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_console_bar_shows_epoch_iteration_loss_and_speed(sc, monkeypatch, caplog):
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    opt = engine(sc, progress_bar=None)          # automatic: stderr is a terminal
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        opt.optimize()
    out = err.getvalue()
    assert out.count("\r") == 6                  # one redraw per iteration (3 per epoch)
    assert "epoch 1/2 3/3" in out and "epoch 2/2 3/3" in out
    last = opt.summary.iterations[-1]
    assert f"loss {last.loss:.4g}" in out and "samples/s" in out
    assert "Top1Accuracy" in out                 # the latest validation rides on the bar
    assert out.endswith("\n")
    # the bar owns the terminal line: per-iteration log lines drop to DEBUG
    assert not [r for r in caplog.records if "iteration" in r.getMessage()
                and r.levelno == logging.INFO and "(1/3)" in r.getMessage()]


@pytest.mark.parametrize("setting, terminal", [(False, True), (None, False)])
def test_no_bar_when_turned_off_or_not_interactive(sc, monkeypatch, setting, terminal):
    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    engine(sc, progress_bar=setting, epochs=1).optimize()
    assert err.getvalue() == ""


def test_progress_bar_argument_is_checked(sc):
    with pytest.raises(InvalidArgumentError, match="progress_bar"):
        engine(sc, progress_bar="yes")


def test_tensorboard_summaries_hold_the_training_record(sc, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    opt = engine(sc, progress_bar=False).set_tensorboard(str(tmp_path))
    opt.optimize()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert losses == [(r.iteration, pytest.approx(r.loss, rel=1e-6))
                      for r in opt.summary.iterations]
    accuracy = [(e.step, e.value) for e in events.Scalars("validation/Top1Accuracy")]
    assert accuracy == [(v.iteration, pytest.approx(v.metrics["Top1Accuracy"], rel=1e-6))
                        for v in opt.summary.validations]


def test_tensorboard_missing_is_a_clear_error_before_training(sc, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    opt = engine(sc, progress_bar=False)
    with pytest.raises(InvalidArgumentError, match="pip install tensorboard"):
        opt.set_tensorboard("/tmp/tb")
