"""A checkpoint directory that no stop can corrupt (issue: a fit is what determines its result).

Every mutating file-system call of a checkpointed fit (directory creation, each write, each
rename, each removal) is a kill point: the run is stopped there (the file system fails that call
and every later one, as a dead driver would; a write is also torn, half its bytes landing under
the temporary name), then run again. Every such run must resume bitwise with a continuous
history, or refuse with a clear error; none may splice. The fits run in process
(:class:`sparkdl.runners.LocalPartitions`, pyarrow's local file system), so the many kill points
take seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparkdl.storage.arrow_files as arrow_files
from models import SmallNet, bitwise_equal, classification_data
from sparkdl import CheckpointError, DistriOptimizer, Loss, NonFiniteError
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import EveryEpoch, MaxEpoch, MaxIteration, SeveralIteration

ITERATIONS = 18          # 3 epochs of 6 iterations; a checkpoint every 2 iterations


class Killed(BaseException):
    """The driver died (a BaseException: no `except Exception` cleanup runs)."""


class DyingFiles(arrow_files.ArrowFiles):
    """ArrowFiles whose ``kill_at``-th mutating call, and every call after it, fails."""

    kill_at: int | None = None
    torn = False
    calls = 0
    dead = False

    def _tick(self) -> None:
        cls = type(self)
        if cls.dead:
            raise Killed("dead")
        cls.calls += 1
        if cls.calls == cls.kill_at:
            cls.dead = True
            raise Killed(f"killed at call {cls.calls}")

    def mkdirs(self, directory):
        self._tick()
        return super().mkdirs(directory)

    def write(self, directory, name, data):
        cls = type(self)
        if not cls.dead and cls.torn and cls.calls + 1 == cls.kill_at:
            super().write(directory, name, bytes(data)[:len(data) // 2])
        self._tick()
        return super().write(directory, name, data)

    def replace(self, directory, source, target):
        self._tick()
        return super().replace(directory, source, target)

    def delete(self, directory, name):
        self._tick()
        return super().delete(directory, name)

    def names(self, directory):
        if type(self).dead:
            raise Killed("dead")
        return super().names(directory)

    def read(self, directory, name):
        if type(self).dead:
            raise Killed("dead")
        return super().read(directory, name)


def _data():
    x, y = classification_data(48, d=6, seed=5)
    records = list(zip(x, y))
    return LocalPartitions([records[:30], records[30:]])


DATA = _data()
VALIDATION = _data()


def fit(path, end=MaxIteration(ITERATIONS)):
    torch.manual_seed(3)
    net = SmallNet()
    opt = DistriOptimizer(net, DATA, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                          batch_size=8, end_trigger=end, seed=1, progress_bar=False)
    opt.set_validation(VALIDATION, EveryEpoch(), [Loss()])
    opt.set_checkpoint(path, SeveralIteration(2), keep_last=2)
    return opt.optimize(), opt


def history(opt):
    return ([r.iteration for r in opt.summary.iterations],
            [r.loss for r in opt.summary.iterations],
            [(v.iteration, v.metrics) for v in opt.summary.validations])


@pytest.fixture
def dying(monkeypatch):
    monkeypatch.setattr(arrow_files, "ArrowFiles", DyingFiles)
    DyingFiles.kill_at, DyingFiles.calls, DyingFiles.dead, DyingFiles.torn = None, 0, False, False
    return DyingFiles


def test_a_stop_at_any_file_system_call_resumes_bitwise_or_refuses(tmp_path, dying):
    clean, clean_opt = fit(str(tmp_path / "clean"))
    total = dying.calls
    assert total >= 50, total                     # the acceptance asks for at least 50
    expected = history(clean_opt)
    assert expected[0] == list(range(1, ITERATIONS + 1))
    outcomes = {"resumed": 0, "refused": 0}
    for torn in (False, True):
        for k in range(1, total + 1):
            where = tmp_path / f"{'torn' if torn else 'kill'}-{k}"
            dying.kill_at, dying.calls, dying.dead, dying.torn = k, 0, False, torn
            with pytest.raises(Killed):
                fit(str(where))
            dying.kill_at, dying.calls, dying.dead = None, 0, False
            try:
                model, opt = fit(str(where))
            except CheckpointError as exc:          # allowed: refused, clearly
                assert str(where) in str(exc)
                outcomes["refused"] += 1
                continue
            assert bitwise_equal(model, clean), (k, torn)
            assert history(opt)[0] == expected[0], (k, torn, history(opt)[0])
            assert [v[0] for v in history(opt)[2]] == [v[0] for v in expected[2]], (k, torn)
            outcomes["resumed"] += 1
            names = sorted(p.name for p in where.iterdir())
            assert not [n for n in names if n.endswith(".tmp")], (k, torn, names)
    assert outcomes["refused"] == 0, outcomes


def test_a_nan_stop_after_a_regular_checkpoint_keeps_that_checkpoint_resumable(tmp_path):
    x, _ = classification_data(48, d=6, seed=5)
    records = [(row, np.array([row.sum() * 100], np.float32)) for row in x]
    data = LocalPartitions([records[:24], records[24:]])

    def run(end):
        torch.manual_seed(3)
        net = torch.nn.Linear(6, 1)
        opt = DistriOptimizer(net, data, torch.nn.MSELoss(),
                              torch.optim.SGD(net.parameters(), lr=3.0), batch_size=8,
                              end_trigger=end, seed=1, progress_bar=False)
        opt.set_checkpoint(str(tmp_path), SeveralIteration(1), keep_last=3)
        return opt

    with pytest.raises(NonFiniteError) as stop:       # the step diverges to inf, then NaN
        run(MaxEpoch(20)).optimize()
    last_good = stop.value.iteration - 1
    assert last_good >= 2
    assert stop.value.checkpoint.endswith(f"checkpoint-{last_good:010d}.pt")
    # the checkpoint the error names resumes, with its whole history
    opt = run(MaxIteration(last_good))
    opt.optimize()
    assert [r.iteration for r in opt.summary.iterations] == list(range(1, last_good + 1))
    assert all(math.isfinite(r.loss) for r in opt.summary.iterations)


def test_a_stray_summary_part_is_never_spliced_into_a_resumed_history(tmp_path):
    path = str(tmp_path)
    fit(path, MaxIteration(4))                   # checkpoints 2 and 4
    # a part a killed driver wrote for iteration 6 without its checkpoint, and one for 3
    import shutil
    parts = sorted(p for p in tmp_path.iterdir() if p.name.startswith("summary-"))
    shutil.copy(parts[-1], tmp_path / "summary-0000000006-0123456789abcdef.pt")
    shutil.copy(parts[0], tmp_path / "summary-0000000003-fedcba9876543210.pt")
    model, opt = fit(path)
    assert history(opt)[0] == list(range(1, ITERATIONS + 1))
    clean, _ = fit(str(tmp_path / "clean"))
    assert bitwise_equal(model, clean)
    assert not (tmp_path / "summary-0000000006-0123456789abcdef.pt").exists()
    assert not (tmp_path / "summary-0000000003-fedcba9876543210.pt").exists()


def test_a_history_with_a_gap_is_refused(tmp_path):
    path = str(tmp_path)
    fit(path, MaxIteration(6))
    state_file = tmp_path / "checkpoint-0000000006.pt"
    state = torch.load(state_file, weights_only=True)
    state["summary_parts"] = state["summary_parts"][:1] + state["summary_parts"][2:]
    state["summary_records"][0] = 4
    torch.save(state, state_file)
    with pytest.raises(CheckpointError, match=r"not continuous: its iteration records read "
                                              r"\[1, 2, 5, 6\]"):
        fit(path)


def test_a_checkpoint_of_the_previous_format_still_resumes(tmp_path, caplog):
    """Written before parts were named by content and identities derived from it: its parts
    are chosen by iteration number, its key compared on the data and settings only (with a
    warning), and it resumes bitwise."""
    path = str(tmp_path)
    fit(path, MaxIteration(6))
    for name in ("checkpoint-0000000004.pt", "checkpoint-0000000006.pt"):
        state = torch.load(tmp_path / name, weights_only=True)
        for part in state.pop("summary_parts"):          # the previous format's names
            if (tmp_path / part).exists():
                (tmp_path / part).rename(tmp_path / (part[:18] + ".pt"))
        run = state["run"]
        state["run"] = {k: run[k] for k in ("seed", "batch_size", "shuffle", "partition_sizes",
                                             "micro_batch_size", "lr_scheduler_step",
                                             "compression", "precision", "sub_replicas", "data")}
        state["run"]["optimizer"] = {"class": "SGD", "groups": []}   # recorded another way
        torch.save(state, tmp_path / name)
    with caplog.at_level("WARNING", logger="sparkdl"):
        model, opt = fit(path)
    assert "predates fit identities derived from content" in caplog.text
    assert history(opt)[0] == list(range(1, ITERATIONS + 1))
    clean, _ = fit(str(tmp_path / "clean"))
    assert bitwise_equal(model, clean)
    assert (tmp_path / "summary-0000000002.pt").exists()   # an older checkpoint may need it
