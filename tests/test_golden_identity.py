"""Fit identities and resume keys are kept byte for byte across changes of the engine's code.

A checkpoint is resumed only by a fit whose resume key equals the one it was written with; a
refactoring that changed a key would silently start every user's fits from scratch (estimators:
in a new subdirectory) or refuse their checkpoints. So the keys of four kinds of fits (an engine
fit, an estimator fit, a pass of two fits, a hop) are kept in ``tests/golden/identities.json``,
and ``tests/golden/engine-checkpoint/`` holds a checkpoint written by the code that wrote them:
this test computes the keys anew and resumes that checkpoint.

The digests depend on the interpreter's bytecode and torch's version (the user's functions are
identified by their code, torch's classes by its version), so the file records both; CI runs
this test with the same ones (Python 3.11, the torch of constraints.txt). Regenerate only when
an identity change is intended (then raise ``IDENTITY_VERSION``):
``python tests/test_golden_identity.py --write``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from models import SmallNet, bitwise_equal, classification_data  # noqa: E402
from sparkdl import DistriOptimizer, FitSet, Loss  # noqa: E402
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


def test_a_checkpoint_written_by_an_earlier_head_resumes(tmp_path):
    """The golden directory holds the engine fit's checkpoint after epoch 1; a 2-epoch run of
    the same fit resumes it (epoch 2 only) and equals a fresh 2-epoch run bitwise."""
    directory = tmp_path / "engine"
    shutil.copytree(GOLDEN / "engine-checkpoint", directory)
    resumed = _fit(epochs=2).set_checkpoint(str(directory), EveryEpoch(), by_fit=True)
    resumed.optimize()
    per_epoch = 5
    assert [r.iteration for r in resumed.summary.iterations] == list(range(1, 2 * per_epoch + 1))
    fresh = _fit(epochs=2).optimize()
    assert bitwise_equal(resumed.model, fresh)
    assert len([p for p in directory.iterdir() if p.name.startswith("fit-")]) == 1


def write() -> None:
    """Compute the keys and the checkpoint anew into tests/golden (see the module docstring)."""
    from pyspark.sql import SparkSession

    work = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "sparkdl-golden"
    keys = current(work)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
        .getOrCreate()
    keys["estimator"] = estimator_keys(spark, work / "estimator")
    spark.stop()
    GOLDEN.mkdir(exist_ok=True)
    (GOLDEN / "identities.json").write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(GOLDEN / "engine-checkpoint", ignore_errors=True)
    shutil.copytree(work / "engine", GOLDEN / "engine-checkpoint")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import test_golden_identity     # the functions as the test imports them (their module's name)

    test_golden_identity.write()
