"""Fit identities and resume keys are kept byte for byte across changes of the engine's code.

A checkpoint is resumed only by a fit whose resume key equals the one it was written with; a
refactoring that changed a key would silently start every user's fits from scratch (estimators:
in a new subdirectory) or refuse their checkpoints. So the keys of four kinds of fits (an engine
fit, an estimator fit, a pass of two fits, a hop) are kept in ``tests/golden/identities.json``,
and ``tests/golden/engine-checkpoint/`` holds a checkpoint written by the code that wrote them:
this test computes the keys anew and resumes that checkpoint.

The digests depend on the interpreter's bytecode and torch's version (the user's functions are
identified by their code, torch's classes by its version), so the file records both; CI runs
this test with the same ones (Python 3.11, the torch of constraints.txt). The checkpoint's
weights depend on more: the numeric platform that computed them (the CPU and the BLAS code path
its kernels take, :mod:`sparkdl.engine.fit.resume.numeric_platform`), recorded as ``checkpoint
platform``. So resuming it is checked apart from its weights (any machine), and its weights
against this platform's epoch 1 (a failure names both platforms: another platform's rounding
is not a change of the code). Regenerate only when an identity change is intended (then raise
``IDENTITY_VERSION``) or on the platform CI runs on:
``python tests/test_golden_identity.py --write``.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from models import SmallNet, bitwise_equal, classification_data  # noqa: E402
from sparkdl import DistriOptimizer, FitSet, Loss  # noqa: E402
from sparkdl.engine.fit.resume.numeric_platform import (  # noqa: E402
    numeric_platform, platform_differences)
from sparkdl.runners import LocalPartitions  # noqa: E402
from sparkdl.triggers import EveryEpoch, MaxEpoch  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
X, Y = classification_data(40, d=6, seed=21)
DATA = LocalPartitions([list(zip(X[:20], Y[:20])), list(zip(X[20:], Y[20:]))])
VALIDATION = LocalPartitions([list(zip(*classification_data(12, d=6, seed=22)))])


def _fit(lr: float = 0.1, epochs: int = 1) -> DistriOptimizer:
    torch.manual_seed(7)
    net = SmallNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    opt = DistriOptimizer(net, DATA, torch.nn.CrossEntropyLoss(), optimizer, batch_size=8,
                          end_trigger=MaxEpoch(epochs), seed=3, progress_bar=False,
                          lr_scheduler=torch.optim.lr_scheduler.LambdaLR(
                              optimizer, lambda e: 0.9 ** e))
    opt.set_validation(VALIDATION, EveryEpoch(), [Loss()])
    opt.set_gradient_clipping(5.0)
    return opt


def _keys(directory: pathlib.Path) -> dict[str, dict]:
    """Each fit subdirectory of ``directory``: the resume key its newest checkpoint carries."""
    out = {}
    for sub in sorted(p for p in directory.iterdir() if p.name.startswith("fit-")):
        newest = sorted(sub.glob("checkpoint-*.pt"))[-1]
        state = torch.load(newest, weights_only=True)
        out[sub.name] = json.loads(json.dumps(state["run"], default=repr))
    return out


def current(work: pathlib.Path) -> dict:
    """The keys of the four kinds of fits, computed now (in ``work``)."""
    from sparkdl.engine.fit.resume.fit_identity import fit_identity

    shutil.rmtree(work, ignore_errors=True)
    out: dict = {"python": list(sys.version_info[:2]), "torch": torch.__version__}
    engine = _fit()
    out["engine identity"] = json.loads(json.dumps(fit_identity(engine), default=repr))
    engine.set_checkpoint(str(work / "engine"), EveryEpoch(), by_fit=True).optimize()
    out["engine"] = _keys(work / "engine")
    fits = [_fit(0.1).set_checkpoint(str(work / "pass"), EveryEpoch(), by_fit=True),
            _fit(0.05).set_checkpoint(str(work / "pass"), EveryEpoch(), by_fit=True)]
    FitSet(fits).run()
    out["pass"] = _keys(work / "pass")
    hops = [_fit(0.1).set_checkpoint(str(work / "hop"), EveryEpoch(), by_fit=True),
            _fit(0.05).set_checkpoint(str(work / "hop"), EveryEpoch(), by_fit=True)]
    FitSet(hops, strategy="hop", hop_seed=4).run()
    out["hop"] = _keys(work / "hop")
    return out


def estimator_keys(spark, work: pathlib.Path) -> dict:
    from pyspark.ml.linalg import Vectors

    from sparkdl import NNClassifier

    shutil.rmtree(work, ignore_errors=True)
    df = spark.createDataFrame([(Vectors.dense(x.tolist()), int(y)) for x, y in zip(X, Y)],
                               ["features", "label"]).coalesce(2)
    NNClassifier(model=_estimator_net, criterion=torch.nn.CrossEntropyLoss(), batchSize=8,
                 maxEpoch=1, learningRate=0.05, optimizer="sgd", momentum=0.9, seed=5,
                 progressBar=False, checkpointDir=str(work)).fit(df)
    return _keys(work)


def _estimator_net() -> torch.nn.Module:
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _golden() -> dict:
    return json.loads((GOLDEN / "identities.json").read_text())


def test_engine_pass_and_hop_keys_are_those_of_the_golden_file(tmp_path):
    golden = _golden()
    assert [golden["python"], golden["torch"]] == [list(sys.version_info[:2]),
                                                   torch.__version__], (
        "the golden keys were computed with another Python or torch: bytecode and torch's "
        "version are part of them; compute them on the versions CI uses")
    now = current(tmp_path)
    for kind in ("engine identity", "engine", "pass", "hop"):
        assert now[kind] == golden[kind], f"the {kind} key changed"


def test_an_estimator_fits_key_is_that_of_the_golden_file(spark, tmp_path):
    assert estimator_keys(spark, tmp_path) == _golden()["estimator"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> tuple[torch.nn.Module, dict]:
    """The 2-epoch fit trained here from scratch, and its checkpoint after epoch 1."""
    directory = tmp_path_factory.mktemp("clean")
    model = _fit(epochs=2).set_checkpoint(str(directory), EveryEpoch(), by_fit=True).optimize()
    epoch_1 = torch.load(next(directory.glob("fit-*/checkpoint-0000000005.pt")),
                         weights_only=True)
    return model, epoch_1


def test_a_checkpoint_written_by_an_earlier_head_resumes(tmp_path, clean_run, caplog):
    """The golden directory holds the engine fit's checkpoint after epoch 1; a 2-epoch run of
    the same fit finds it, accepts it and resumes it (epoch 2 only) to the clean run's bits.

    The values of its weights' and optimizer state's tensors are those this platform computes
    for epoch 1 (the next test compares them), copied into the golden file's own tensors, so
    what this checks holds on any machine and is the earlier head's file otherwise: its resume
    key, format, state dicts' structure and non-tensor entries (param groups), RNG, scheduler
    and trigger states and summary parts are read as they were meant."""
    model, epoch_1 = clean_run
    directory = tmp_path / "engine"
    shutil.copytree(GOLDEN / "engine-checkpoint", directory)
    path = next(directory.glob("fit-*/checkpoint-*.pt"))
    state = torch.load(path, weights_only=True)
    for part in ("model_state", "optimizer_state"):
        for name, theirs, ours in _tensors(state[part], epoch_1[part], part):
            assert theirs.dtype == ours.dtype and theirs.shape == ours.shape, name
            theirs.copy_(ours)
    torch.save(state, path)
    resumed = _fit(epochs=2).set_checkpoint(str(directory), EveryEpoch(), by_fit=True)
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        resumed.optimize()
    assert any(m.startswith(f"resuming from checkpoint {path}: iteration 5, epoch 1")
               for m in caplog.messages)
    per_epoch = 5
    assert [r.iteration for r in resumed.summary.iterations] == list(range(1, 2 * per_epoch + 1))
    assert bitwise_equal(resumed.model, model)
    assert len([p for p in directory.iterdir() if p.name.startswith("fit-")]) == 1


def test_the_golden_checkpoint_holds_what_this_platform_computes(clean_run):
    """The golden checkpoint's weights and optimizer state are this platform's epoch 1: bitwise
    on the platform the golden files were written on; elsewhere (another CPU or BLAS code path
    rounds otherwise) within 1e-5 of each tensor's largest magnitude, far below what computing
    an iteration otherwise moves (a learning rate, a skipped batch) and far above rounding."""
    golden = torch.load(next((GOLDEN / "engine-checkpoint").glob("fit-*/checkpoint-*.pt")),
                        weights_only=True)
    here = clean_run[1]
    recorded = _golden()["checkpoint platform"]
    differences = platform_differences(recorded, numeric_platform())
    differing, apart = {}, {}
    for part in ("model_state", "optimizer_state"):
        for name, theirs, ours in _tensors(golden[part], here[part], part):
            assert theirs.dtype == ours.dtype and theirs.shape == ours.shape, name
            if not torch.equal(theirs, ours):
                differing[name] = _ulps(theirs, ours)
                scale = max(float(theirs.abs().max()), 1e-30)
                apart[name] = float((theirs.double() - ours.double()).abs().max()) / scale
    if not differences:
        assert not differing, (
            f"the golden checkpoint's epoch 1 differs from this platform's in {differing} (most "
            f"units in the last place apart, per tensor), and identities.json records this "
            f"platform for it ({recorded}): the code computes an iteration otherwise than the "
            "head that wrote it")
    far = {name: gap for name, gap in apart.items() if gap > 1e-5}
    assert not far, (
        f"the golden checkpoint's epoch 1 is further from this platform's than rounding: {far} "
        f"(largest gap over the tensor's largest magnitude; written on {'; '.join(differences)})")


def _tensors(theirs, ours, path: str):
    """Each tensor of two nested states, with its path, in the order ``theirs`` holds them."""
    if isinstance(theirs, torch.Tensor):
        yield path, theirs, ours
    elif isinstance(theirs, dict):
        for key in theirs:
            yield from _tensors(theirs[key], ours[key], f"{path}.{key}")
    elif isinstance(theirs, (list, tuple)):
        for k, item in enumerate(theirs):
            yield from _tensors(item, ours[k], f"{path}[{k}]")


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int | str:
    """The most units in the last place two float32 tensors are apart (their bits as ordered
    integers)."""
    if a.dtype != torch.float32 or b.dtype != a.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
    ordered = [torch.where(t < 0, -(t.view(torch.int32) & 0x7FFFFFFF), t.view(torch.int32))
               .to(torch.int64) for t in (a, b)]
    return int((ordered[0] - ordered[1]).abs().max())


def write() -> None:
    """Compute the keys and the checkpoint anew into tests/golden (see the module docstring)."""
    from pyspark.sql import SparkSession

    work = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "sparkdl-golden"
    keys = current(work)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
        .getOrCreate()
    keys["estimator"] = estimator_keys(spark, work / "estimator")
    keys["checkpoint platform"] = numeric_platform()
    spark.stop()
    GOLDEN.mkdir(exist_ok=True)
    (GOLDEN / "identities.json").write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(GOLDEN / "engine-checkpoint", ignore_errors=True)
    shutil.copytree(work / "engine", GOLDEN / "engine-checkpoint")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import test_golden_identity     # the functions as the test imports them (their module's name)

    test_golden_identity.write()
