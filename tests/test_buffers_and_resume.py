"""Edge cases of the buffer rule and of resuming (issue: real models; found in review)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models import SmallNet, bitwise_equal, classification_data, make_rdd
from sparkdl import CheckpointError, DistriOptimizer, InvalidArgumentError, Loss, SparkdlError
from sparkdl.transport.flat_layout import ParamLayout, combine_buffers
from sparkdl.triggers import EarlyStopping, MaxIteration, SeveralIteration


class Observed(torch.nn.Module):
    """A quantization-observer-like buffer pair that starts at +-inf."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))
        self.register_buffer("seen", torch.zeros(6), persistent=False)

    def forward(self, x):
        if self.training:
            self.min_val = torch.minimum(self.min_val, x.min())
            self.max_val = torch.maximum(self.max_val, x.max())
            self.seen += x.abs().mean(0)
        return self.fc(x)


def _raw(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_buffers_starting_at_infinity_average_to_finite_values():
    model = Observed()
    layout = ParamLayout(model)
    state = layout.state_vector(model)
    index = {s.name: k for k, s in enumerate(layout.buffers)}
    changes = [(0.25, {index["min_val"]: _raw(torch.tensor(-1.0))}),
               (0.75, {index["min_val"]: _raw(torch.tensor(-3.0))})]
    combined = combine_buffers(layout, state, changes)
    assert float(combined[index["min_val"]]) == -2.5        # 0.25 * -1 + 0.75 * -3
    assert index["max_val"] not in combined                  # no task changed it: untouched


def test_a_buffer_that_changes_size_is_a_clear_error():
    model = Observed()
    layout = ParamLayout(model)
    k = next(k for k, s in enumerate(layout.buffers) if s.name == "seen")
    with pytest.raises(SparkdlError, match=r"buffer 'seen' changed its size"):
        combine_buffers(layout, layout.state_vector(model),
                        [(1.0, {k: _raw(torch.zeros(7))})])


def test_a_model_not_on_the_cpu_is_refused():
    net = SmallNet().to("meta")
    with pytest.raises(InvalidArgumentError, match=r"must be on the CPU \(it is on \['meta'\]\)"):
        DistriOptimizer(net, None, torch.nn.CrossEntropyLoss(),
                        torch.optim.SGD(net.parameters(), lr=0.1), batch_size=2)


def _run(sc, path, iterations, model, end=None, validation=None, **kwargs):
    x, y = classification_data(80, seed=9)
    net = copy.deepcopy(model)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [50, 30]),
                          torch.nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), lr=0.05),
                          batch_size=20, end_trigger=end or MaxIteration(iterations), seed=4,
                          progress_bar=False, **kwargs)
    if validation:
        opt.set_validation(make_rdd(sc, list(zip(x, y)), [40, 40]), SeveralIteration(1),
                           [Loss()])
    if path is not None:
        opt.set_checkpoint(str(path), SeveralIteration(1), keep_last=2)
    return opt.optimize(), opt


def test_non_persistent_buffers_survive_a_resume(sc, tmp_path):
    torch.manual_seed(0)
    model = Observed()
    uninterrupted, _ = _run(sc, None, 6, model)
    _run(sc, tmp_path, 3, model)
    resumed, opt = _run(sc, tmp_path, 6, model)
    assert opt.summary.iterations[0].iteration == 1 and len(opt.summary.iterations) == 6
    assert bitwise_equal(resumed, uninterrupted)
    assert torch.equal(resumed.seen, uninterrupted.seen) and resumed.seen.abs().sum() > 0


def test_resume_with_another_precision_is_refused(sc, tmp_path):
    torch.manual_seed(0)
    model = SmallNet()
    _run(sc, tmp_path, 2, model)
    with pytest.raises(CheckpointError, match=r"written by a run with precision=32, but this run "
                                              r"has precision=bf16-mixed"):
        _run(sc, tmp_path, 4, model, precision="bf16-mixed")


def test_resuming_a_run_that_stopped_early_returns_its_best_weights(sc, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    stop = EarlyStopping("Loss", patience=1, mode="max")    # stops at the first improvement miss
    first, opt = _run(sc, tmp_path, 0, model, end=MaxIteration(40) | stop, validation=True)
    assert len(opt.summary.iterations) < 40 and stop.stopped
    stop_again = EarlyStopping("Loss", patience=1, mode="max")
    again, opt2 = _run(sc, tmp_path, 0, model, end=MaxIteration(40) | stop_again,
                       validation=True)
    assert opt2.iteration == opt.iteration                   # nothing more was trained
    assert bitwise_equal(again, first)                       # the best weights, as before
    assert not np.isnan(stop_again.best)
