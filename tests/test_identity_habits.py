"""The fit identity under users' ordinary habits (issue: identity defects found by an audit).

Each of the seven defects found on 53c32f0 has a test here that failed there:

1. a set of fits sharing one checkpoint directory waited on itself for ever;
2. a combined end trigger (``MaxEpoch(2) | EarlyStopping(...)``) resumed a longer run's end;
3. a changed installed package without ``__version__`` was resumed;
4. a tuner without a fixed seed resumed nothing after a restart, without a word;
5. a function naming a global RNG method (``from random import random``) got a new identity in
   every process;
6. a lambda reading ``args.decay`` depended on the whole argparse Namespace, and a pandas
   table's digest changed once a column was read;
7. ``fitIdentity="   "`` was refused in the engine's words (and transform's widths, checked
   before the job, are in tests/test_edge_inputs.py).

The battery of objects identified alike in two processes is tests/identity_battery_job.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch

from models import SmallNet, bitwise_equal, classification_data
from sparkdl import CheckpointError, DistriOptimizer, FitSet, InvalidArgumentError, Loss
from sparkdl.engine.fit.resume import checkpoint_directories
from sparkdl.engine.fit.resume.checkpoint_directories import DirectoryHeldError, exclusive_directory
from sparkdl.engine.fit.resume.content_digest import content_digest
from sparkdl.engine.fit.resume.fit_identity import fit_identity
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import (EarlyStopping, EveryEpoch, MaxEpoch, MaxIteration, MinLoss,
                              planned_iterations)

HERE = pathlib.Path(__file__).resolve().parent
X, Y = classification_data(48, d=6, seed=11)
DATA = LocalPartitions([list(zip(X[:24], Y[:24])), list(zip(X[24:], Y[24:]))])
OTHER = LocalPartitions([list(zip(X[:20], Y[:20])), list(zip(X[20:], Y[20:]))])
VALIDATION = LocalPartitions([list(zip(*classification_data(16, d=6, seed=12)))])


def fit(epochs=2, data=DATA, end=None, lr=0.1, scheduler=None):
    torch.manual_seed(3)
    net = SmallNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.5)
    return DistriOptimizer(net, data, torch.nn.CrossEntropyLoss(), optimizer, batch_size=12,
                           end_trigger=end or MaxEpoch(epochs), seed=2, progress_bar=False,
                           lr_scheduler=scheduler(optimizer) if scheduler else None)


def finishes(run, seconds=120):
    """Run ``run()`` on a daemon thread; fail (never block the suite) if it is still running
    after ``seconds``. Returns what it returned, or raises what it raised."""
    out: dict[str, object] = {}

    def target():
        try:
            out["value"] = run()
        except BaseException as exc:          # noqa: BLE001 - re-raised below
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: a fit waits on itself"
    if "error" in out:
        raise out["error"]                    # type: ignore[misc]
    return out.get("value")


# --------------------------------------------------------------------- 1. no wait on itself
def test_the_directory_lock_refuses_its_own_thread_at_once(tmp_path):
    def nested():
        with exclusive_directory(str(tmp_path)):
            with exclusive_directory(str(tmp_path) + "/"):
                pass

    with pytest.raises(DirectoryHeldError, match="held by another fit of this thread"):
        finishes(nested, 10)
    with exclusive_directory(str(tmp_path)):             # released: taken again
        pass
    assert issubclass(DirectoryHeldError, CheckpointError)


@pytest.mark.parametrize("by_fit", [False, True])
def test_fits_of_one_identity_in_one_set_take_the_directory_one_after_the_other(tmp_path,
                                                                                 by_fit):
    fresh = fit().optimize()
    fits = [fit().set_checkpoint(str(tmp_path), EveryEpoch(), by_fit=by_fit) for _ in range(2)]
    fit_set = FitSet(fits)
    finishes(fit_set.run)
    assert fit_set.passes == [[0, 1], [1]]                # the second in a later pass
    assert all(bitwise_equal(f.model, fresh) for f in fits)
    # the second resumed the first's end: its history is the first's, nothing trained again
    assert [r.iteration for r in fits[1].summary.iterations] == list(range(1, 9))
    assert fits[1].summary.iterations == fits[0].summary.iterations


def test_fits_of_other_identities_in_one_plain_directory_are_refused_before_any_job(tmp_path):
    fits = [fit(lr=0.1).set_checkpoint(str(tmp_path), EveryEpoch()),
            fit(lr=0.3).set_checkpoint(str(tmp_path), EveryEpoch())]
    with pytest.raises(CheckpointError, match=r"Fits 0 and 1 of this set write checkpoints to "
                                              r"the same directory .*they differ in optimizer"):
        finishes(FitSet(fits).run)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")]
    assert all(f.iteration == 0 for f in fits)


def test_an_estimator_grid_over_params_outside_the_identity_shares_its_directory(spark,
                                                                                tmp_path):
    from pyspark.ml.linalg import Vectors

    from sparkdl import NNClassifier

    df = spark.createDataFrame([(Vectors.dense(x.tolist()), int(y)) for x, y in zip(X, Y)],
                               ["features", "label"]).repartition(2).cache()
    clf = NNClassifier(model=lambda: torch.nn.Linear(6, 3), criterion=torch.nn.CrossEntropyLoss(),
                       batchSize=16, maxEpoch=2, progressBar=False, checkpointDir=str(tmp_path))
    maps = [{clf.inferenceBatchSize: 64}, {clf.inferenceBatchSize: 128},
            {clf.inferenceBatchSize: 128}]
    models = dict(finishes(lambda: list(clf.fitMultiple(df, maps)), 240))
    assert len(models) == 3
    assert all(bitwise_equal(models[0].module, models[k].module) for k in (1, 2))
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("fit-")]) == 1


def test_a_batched_study_suggesting_one_value_twice_trains_both(tmp_path):
    import optuna

    from sparkdl.engine.optuna_batches import BatchedStudy

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))

    def make_fit(trial):
        opt = fit(lr=trial.suggest_categorical("lr", [0.1]))
        opt.set_validation(VALIDATION, EveryEpoch(), [Loss()])
        return opt.set_checkpoint(str(tmp_path), EveryEpoch(), by_fit=True)

    finishes(lambda: BatchedStudy(study, make_fit, "Loss", batch_size=2).optimize(2))
    values = [t.value for t in study.trials]
    assert len(values) == 2 and values[0] == values[1]


# --------------------------------------------------------- 2. a combined trigger's bound
def test_planned_iterations_reads_combined_triggers():
    stop = EarlyStopping("Loss", patience=3)
    assert planned_iterations(MaxEpoch(2) | stop, 4) == 8
    assert planned_iterations(MaxEpoch(2) | MaxIteration(5), 4) == 5
    assert planned_iterations(MaxEpoch(2) & MaxIteration(5), 4) == 8
    assert planned_iterations(MaxEpoch(2) & MinLoss(0.1), 4) is None
    assert planned_iterations(stop | MinLoss(0.1), 4) is None
    assert planned_iterations((MaxEpoch(3) | MinLoss(0.1)) & MaxIteration(2), 4) == 12


@pytest.mark.parametrize("other", ["early stopping", "min loss"])
def test_a_shorter_run_with_a_combined_trigger_refuses_a_longer_runs_checkpoint(tmp_path,
                                                                                other):
    def run(epochs):
        extra = (EarlyStopping("Loss", patience=50) if other == "early stopping"
                 else MinLoss(1e-9))
        opt = fit(end=MaxEpoch(epochs) | extra)
        opt.set_validation(VALIDATION, EveryEpoch(), [Loss()])
        return opt.set_checkpoint(str(tmp_path), EveryEpoch(), by_fit=True)

    longer = run(6)
    longer.optimize()
    assert len(longer.summary.iterations) == 24
    with pytest.raises(CheckpointError, match=r"at iteration 24, past this run's end at "
                                              r"iteration 8"):
        run(2).optimize()


# --------------------------------------------------------------- 3. installed packages
NET_SOURCE = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return torch.{activation}(self.fc(x))
"""

FIT_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
import mymodels
from models import classification_data
from sparkdl import DistriOptimizer
from sparkdl.engine.fit.resume.content_digest import content_digest
from sparkdl.engine.fit.resume.installed_code import library_version
from sparkdl.runners import LocalPartitions
from sparkdl.triggers import EveryEpoch, MaxEpoch
print("VERSION", library_version("mymodels"), flush=True)
print("DIGEST", content_digest(mymodels.Net, "Net"), flush=True)
x, y = classification_data(24, d=6, seed=1)
torch.manual_seed(0)
net = mymodels.Net()
opt = DistriOptimizer(net, LocalPartitions([list(zip(x, y))]), torch.nn.CrossEntropyLoss(),
                      torch.optim.SGD(net.parameters(), lr=0.1), batch_size=8,
                      end_trigger=MaxEpoch(1), progress_bar=False)
opt.set_checkpoint({checkpoints!r}, EveryEpoch()).optimize()
print("TRAINED", flush=True)
"""


def _install(site: pathlib.Path, activation: str, version: str | None,
             editable: bool = False) -> None:
    """``mymodels`` in ``site`` (a site-packages directory), owned by a distribution of
    ``version`` (None: no distribution owns it)."""
    for old in site.glob("mymodels*"):
        if old.is_dir():
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    package = site / "mymodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(NET_SOURCE.format(activation=activation))
    if version is None:
        return
    info = site / f"mymodels-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mymodels\nVersion: {version}\n")
    (info / "RECORD").write_text("mymodels/__init__.py,,\n")
    (info / "top_level.txt").write_text("mymodels\n")
    if editable:
        (info / "direct_url.json").write_text(json.dumps(
            {"url": "file:///src/mymodels", "dir_info": {"editable": True}}))


def _run(site: pathlib.Path, checkpoints: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(site), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", FIT_SCRIPT.format(
        tests=str(HERE), checkpoints=str(checkpoints))], env=env, capture_output=True,
        text=True, timeout=300)


def _line(result, tag):
    return next(line.split(" ", 1)[1] for line in result.stdout.splitlines()
                if line.startswith(tag))


def test_a_changed_installed_package_is_never_resumed(tmp_path):
    site = tmp_path / "lib" / "site-packages"
    _install(site, "relu", "1.0")
    first = _run(site, tmp_path / "ck")
    assert "TRAINED" in first.stdout, first.stderr[-3000:]
    assert _line(first, "VERSION") == "1.0"
    _install(site, "sigmoid", "2.0")          # no __version__: only the metadata says 2.0
    second = _run(site, tmp_path / "ck")
    assert _line(second, "VERSION") == "2.0"
    assert _line(second, "DIGEST") != _line(first, "DIGEST")
    assert "TRAINED" not in second.stdout
    assert "CheckpointError" in second.stderr and "belongs to another fit" in second.stderr
    # no distribution owns it, or an editable one: identified by its code
    _install(site, "relu", None)
    relu = _line(_run(site, tmp_path / "none-relu"), "DIGEST")
    _install(site, "sigmoid", None)
    sigmoid = _run(site, tmp_path / "none-sigmoid")
    assert _line(sigmoid, "VERSION") == "None" and _line(sigmoid, "DIGEST") != relu
    _install(site, "sigmoid", "2.0", editable=True)
    editable = _run(site, tmp_path / "editable")
    assert _line(editable, "VERSION") == "None"
    assert _line(editable, "DIGEST") == _line(sigmoid, "DIGEST")   # by content alone


# ---------------------------------------------------------------------------- 4. tuners
def test_a_fit_without_its_checkpoint_beside_other_runs_same_settings_says_so_once(
        tmp_path, caplog, monkeypatch):
    path = str(tmp_path)
    fit().set_checkpoint(path, EveryEpoch(), by_fit=True).optimize()
    caplog.set_level(logging.WARNING, logger="sparkdl")
    fit(data=OTHER).set_checkpoint(path, EveryEpoch(), by_fit=True).optimize()
    assert "tuner without a fixed seed" not in caplog.text    # one run's folds: no note
    monkeypatch.setattr(checkpoint_directories, "_PROCESS", "restarted000")   # a new driver
    other = LocalPartitions([list(zip(X[:30], Y[:30])), list(zip(X[30:], Y[30:]))])
    fit(data=other).set_checkpoint(path, EveryEpoch(), by_fit=True).optimize()
    assert caplog.text.count("tuner without a fixed seed") == 1
    assert "CrossValidator and TrainValidationSplit" in caplog.text
    more = LocalPartitions([list(zip(X[:28], Y[:28])), list(zip(X[28:], Y[28:]))])
    fit(data=more).set_checkpoint(path, EveryEpoch(), by_fit=True).optimize()
    assert caplog.text.count("tuner without a fixed seed") == 1    # once
    # the fit that resumes its own says nothing; other settings are not "the same"
    checkpoint_directories._TOLD.clear()
    caplog.clear()
    fit().set_checkpoint(path, EveryEpoch(), by_fit=True).optimize()
    fit(data=OTHER, lr=0.3).set_checkpoint(path, EveryEpoch(), by_fit=True).optimize()
    assert "tuner without a fixed seed" not in caplog.text


def test_the_docs_tuner_examples_pass_a_seed():
    root = HERE.parent
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    calls = 0
    for page in pages:
        text = page.read_text()
        for tuner in ("CrossValidator(", "TrainValidationSplit("):
            start = text.find(tuner)
            while start != -1:
                if text[start - 1] not in "`[." and not text[start - 6:start].endswith("import "):
                    depth, end = 0, start + len(tuner) - 1
                    for end in range(start + len(tuner) - 1, len(text)):
                        depth += {"(": 1, ")": -1}.get(text[end], 0)
                        if depth == 0:
                            break
                    call = text[start:end + 1]
                    if "estimator" in call:
                        calls += 1
                        assert "seed=" in call, f"{page.name}: {call}"
                start = text.find(tuner, start + 1)
    assert calls >= 2


# -------------------------------------------------------------- 5. global RNG functions
def test_a_function_naming_a_global_generator_is_identified_by_what_it_names():
    from random import gauss, random

    from numpy.random import rand

    def transform(features, rng):
        if features is None:                 # never taken: naming them is enough
            return features * random() + gauss(0, 1) + rand()
        return features

    before = content_digest(transform, "t")
    np.random.rand(7)
    random()
    assert content_digest(transform, "t") == before
    assert content_digest(types.SimpleNamespace(f=random), "x") != \
        content_digest(types.SimpleNamespace(f=rand), "x")


def test_identities_are_equal_across_processes_for_a_battery_of_objects(tmp_path):
    runs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, SPARKDL_BATTERY_DRAWS=seed,
                   PYTHONPATH=os.pathsep.join([str(HERE.parent),
                                               os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([sys.executable, str(HERE / "identity_battery_job.py")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    first, second = runs
    assert len(first) >= 40
    assert sorted(first) == sorted(second)
    differ = {k: (first[k], second[k]) for k in first if first[k] != second[k]}
    assert not differ, f"identified differently in two processes: {sorted(differ)}"
    assert len(set(first.values())) == len(first)      # and none collapsed into another


# --------------------------------------------------------------- 6. incidental state
def _decay(args):
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                               lambda e: args.decay ** e)


def test_a_closure_over_argparse_args_is_identified_by_the_attributes_it_reads(tmp_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--decay", type=float, default=0.5)
    path = str(tmp_path)
    args = parser.parse_args(["--epochs", "2"])
    first = fit(args.epochs, scheduler=_decay(args)).set_checkpoint(path, EveryEpoch())
    first.optimize()
    args = parser.parse_args(["--epochs", "3"])            # training longer resumes
    again = fit(args.epochs, scheduler=_decay(args)).set_checkpoint(path, EveryEpoch())
    again.optimize()
    assert [r.iteration for r in again.summary.iterations] == list(range(1, 13))
    assert bitwise_equal(again.model, fit(3, scheduler=_decay(args)).optimize())
    args = parser.parse_args(["--epochs", "4", "--decay", "0.9"])   # what it reads: refused
    with pytest.raises(CheckpointError, match="belongs to another fit"):
        fit(args.epochs, scheduler=_decay(args)).set_checkpoint(path, EveryEpoch()).optimize()
    # the same for a module-level value
    global ARGS
    ARGS = argparse.Namespace(decay=0.5, epochs=2)
    read = lambda e: ARGS.decay ** e              # noqa: E731
    before = content_digest(read, "f")
    ARGS.epochs = 3
    assert content_digest(read, "f") == before
    ARGS.decay = 0.6
    assert content_digest(read, "f") != before


ARGS = argparse.Namespace()


def test_a_pandas_table_is_identified_by_its_content_not_its_caches():
    import pandas as pd

    table = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": ["x", "y", "z"]})
    before = content_digest(table, "t")
    _ = table["a"], table["b"].str.upper(), table.loc[1], table.values
    assert content_digest(table, "t") == before
    assert content_digest(table.copy(), "t") == before
    changed = table.copy()
    changed.loc[2, "a"] = 4.0
    assert content_digest(changed, "t") != before
    assert content_digest(table.astype({"a": "float32"}), "t") != before
    assert content_digest(table.rename(columns={"b": "c"}), "t") != before
    series = table["a"]
    assert content_digest(series, "s") == content_digest(pd.Series([1.0, 2.0, 3.0], name="a"),
                                                         "s")


# ------------------------------------------------------------------------ 7. small ones
def test_a_blank_fit_identity_param_is_refused_in_the_params_words(spark):
    from pyspark.ml.linalg import Vectors

    from sparkdl import NNClassifier

    df = spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 0)], ["features", "label"])
    clf = NNClassifier(model=lambda: torch.nn.Linear(2, 2), criterion=torch.nn.CrossEntropyLoss(),
                       fitIdentity="   ")
    with pytest.raises(InvalidArgumentError, match=r"The 'fitIdentity' Param of NNClassifier "
                                                   r"must be a name with a visible character"):
        clf.fit(df)


def test_the_engine_identity_of_a_fit_is_unchanged_by_the_habits_above():
    """The fixes narrow what is read, never what decides: a fit's identity still follows its
    hyperparameters (a guard against a narrowing that reads too little)."""
    assert fit_identity(fit(lr=0.1)) == fit_identity(fit(lr=0.1))
    assert fit_identity(fit(lr=0.1)) != fit_identity(fit(lr=0.2))
