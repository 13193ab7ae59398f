"""A table of bad engine arguments: each gets a clear error and nothing passed is mutated;
and a run leaves nothing of sparkdl's behind (issue: training that survives failures, 5 and 6)."""

from __future__ import annotations

import copy
import os
import threading

import pytest
import torch

from models import SmallNet, classification_data, make_rdd
from sparkdl import CheckpointError, DistriOptimizer, InvalidArgumentError, Top1Accuracy
from sparkdl.triggers import EveryEpoch, MaxEpoch, MaxIteration, SeveralIteration


class Case:
    """One bad input: ``change`` edits the keyword arguments or calls a setter on the engine."""

    def __init__(self, name, error, match, kwargs=None, after=None):
        self.name, self.error, self.match = name, error, match
        self.kwargs, self.after = kwargs or {}, after


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _checkpoint_of_other_model(sc, path):
    net = SmallNet(hidden=4)
    x, y = classification_data(20)
    DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [20]), torch.nn.CrossEntropyLoss(),
                    torch.optim.SGD(net.parameters(), lr=0.1), batch_size=10,
                    end_trigger=MaxIteration(1)).set_checkpoint(path, SeveralIteration(1)
                                                                ).optimize()


CASES = [
    Case("model-not-a-module", InvalidArgumentError, r"'model' argument of DistriOptimizer must "
         r"be a torch\.nn\.Module\. Got function", {"model": lambda x: x}),
    Case("criterion-not-callable", InvalidArgumentError, r"'criterion' argument .* must be a "
         r"callable loss", {"criterion": "cross_entropy"}),
    Case("optimizer-not-an-optimizer", InvalidArgumentError, r"'optimizer' argument .* must be "
         r"a torch\.optim\.Optimizer", {"optimizer": {"lr": 0.1}}),
    Case("end-trigger-an-int", InvalidArgumentError, r"'end_trigger' argument .* must be a "
         r"sparkdl\.triggers\.Trigger such as MaxEpoch\(5\)\. Got 5", {"end_trigger": 5}),
    Case("seed-a-string", InvalidArgumentError, r"'seed' argument .* must be an int\. Got '1'",
         {"seed": "1"}),
    Case("scheduler-of-another-optimizer", InvalidArgumentError, r"'lr_scheduler' argument .* "
         r"must be a torch LR scheduler built over the given optimizer", {"lr_scheduler": "other"}),
    Case("scheduler-step-unknown", InvalidArgumentError, r"'lr_scheduler_step' argument .* must "
         r"be 'epoch' or 'iteration'\. Got 'batch'", {"lr_scheduler_step": "batch"}),
    Case("micro-batch-negative", InvalidArgumentError, r"'micro_batch_size' argument .* must be "
         r"a positive int or None\. Got -1", {"micro_batch_size": -1}),
    Case("allreduce-unknown", InvalidArgumentError, r"'allreduce' argument .* must be 'auto', "
         r"'shuffle' or 'driver'\. Got 'ring'", {"allreduce": "ring"}),
    Case("compression-unknown", InvalidArgumentError, r"'compression' argument .* must be None "
         r"or 'bf16'\. Got 'fp8'", {"compression": "fp8"}),
    Case("progress-bar-not-bool", InvalidArgumentError, r"'progress_bar' argument .* must be "
         r"True, False or None", {"progress_bar": "yes"}),
    Case("num-blocks-zero", InvalidArgumentError, r"'num_blocks' argument .* must be a positive "
         r"int or None\. Got 0", {"num_blocks": 0}),
    Case("shuffle-a-string", InvalidArgumentError, r"'shuffle' argument .* must be a bool\. "
         r"Got 'yes'", {"shuffle": "yes"}),
    Case("max-epoch-zero", InvalidArgumentError, r"'max_epoch' argument of MaxEpoch must be a positive int\. "
         r"Got 0", after=lambda opt, sc, tmp: MaxEpoch(0)),
    Case("validation-trigger-wrong", InvalidArgumentError, r"'trigger' argument of "
         r"DistriOptimizer\.set_validation must be a sparkdl\.triggers\.Trigger",
         after=lambda opt, sc, tmp: opt.set_validation(opt.training_rdd, "epoch",
                                                       [Top1Accuracy()])),
    Case("validation-no-metrics", InvalidArgumentError, r"'metrics' argument of "
         r"DistriOptimizer\.set_validation must be a non-empty list",
         after=lambda opt, sc, tmp: opt.set_validation(opt.training_rdd, EveryEpoch(), [])),
    Case("checkpoint-path-unwritable", CheckpointError, r"checkpoint directory "
         r"'/proc/sparkdl-ckpt' is not writable",
         after=lambda opt, sc, tmp: opt.set_checkpoint("/proc/sparkdl-ckpt", EveryEpoch())),
    Case("checkpoint-path-empty", InvalidArgumentError, r"'path' argument of "
         r"DistriOptimizer\.set_checkpoint must be a non-empty directory path or URI",
         after=lambda opt, sc, tmp: opt.set_checkpoint("  ", EveryEpoch())),
    Case("checkpoint-trigger-wrong", InvalidArgumentError, r"'trigger' argument of "
         r"DistriOptimizer\.set_checkpoint must be a sparkdl\.triggers\.Trigger",
         after=lambda opt, sc, tmp: opt.set_checkpoint(str(tmp), 100)),
    Case("checkpoint-keep-last-zero", InvalidArgumentError, r"'keep_last' argument .* must be a "
         r"positive int\. Got 0",
         after=lambda opt, sc, tmp: opt.set_checkpoint(str(tmp), EveryEpoch(), keep_last=0)),
    Case("checkpoint-dir-not-empty-without-resume", CheckpointError, r"already holds "
         r"checkpoints \(iterations \[1\]\) and resume=False",
         after=lambda opt, sc, tmp: (_write(os.path.join(tmp, "checkpoint-0000000001.pt"), b"x"),
                                     opt.set_checkpoint(str(tmp), EveryEpoch(), resume=False))),
    Case("checkpoint-corrupt", CheckpointError, r"checkpoint-0000000003\.pt is corrupt",
         after=lambda opt, sc, tmp: (_write(os.path.join(tmp, "checkpoint-0000000003.pt"),
                                            b"\x80garbage"),
                                     opt.set_checkpoint(str(tmp), EveryEpoch()).optimize())),
    Case("checkpoint-of-another-model", CheckpointError, r"belongs to a different model",
         after=lambda opt, sc, tmp: (_checkpoint_of_other_model(sc, str(tmp)),
                                     opt.set_checkpoint(str(tmp), EveryEpoch()).optimize())),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_argument_gets_a_clear_error_and_nothing_is_mutated(sc, tmp_path, case):
    x, y = classification_data(30)
    rdd = make_rdd(sc, list(zip(x, y)), [15, 15])
    net = SmallNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    kwargs = dict(model=net, training_rdd=rdd, criterion=torch.nn.CrossEntropyLoss(),
                  optimizer=optimizer, batch_size=10, end_trigger=MaxIteration(2))
    if case.kwargs.get("lr_scheduler") == "other":
        other = torch.optim.SGD(SmallNet().parameters(), lr=0.1)
        case_kwargs = {"lr_scheduler": torch.optim.lr_scheduler.StepLR(other, 1)}
    else:
        case_kwargs = case.kwargs
    kwargs.update(case_kwargs)
    net_before = copy.deepcopy(net.state_dict())
    opt_before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(case.error, match=case.match):
        opt = DistriOptimizer(**kwargs)
        if case.after is not None:
            case.after(opt, sc, tmp_path)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in net_before.items())
    assert optimizer.state_dict() == opt_before
    assert not rdd.is_cached


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except OSError:
                pass
    return sorted(kids)


def _shard_dirs(sc):
    from pyspark.files import SparkFiles

    root = os.path.join(SparkFiles.getRootDirectory(), "sparkdl-shards")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


@pytest.mark.parametrize("fails", [False, True])
def test_nothing_of_sparkdl_is_left_behind(sc, fails):
    x, y = classification_data(40)
    if fails:
        y[3] = 7  # out of range for 3 classes: fails after the shards were built
    rdd = make_rdd(sc, list(zip(x, y)), [20, 20])
    net = SmallNet()
    opt = DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=10,
                          end_trigger=MaxIteration(3))
    opt.set_validation(rdd, EveryEpoch(), [Top1Accuracy()])
    persistent = set(sc._jsc.getPersistentRDDs().keys())
    threads = {t.ident for t in threading.enumerate()}
    temp_files = set(os.listdir(sc._temp_dir))
    children = _children(os.getpid())
    if fails:
        with pytest.raises(Exception):
            opt.optimize()
    else:
        opt.optimize()
    assert set(sc._jsc.getPersistentRDDs().keys()) == persistent, "a cached RDD is left"
    assert {t.ident for t in threading.enumerate()} <= threads, "a thread is left"
    assert set(os.listdir(sc._temp_dir)) <= temp_files, "a broadcast file is left"
    assert _children(os.getpid()) == children, "a process is left"
    assert _shard_dirs(sc) == [], "shard files are left"


def test_sparkdl_opens_no_port_of_its_own():
    import ast
    import sparkdl

    root = os.path.dirname(sparkdl.__file__)
    networking = {"socket", "socketserver", "http", "xmlrpc", "asyncio", "multiprocessing",
                  "selectors", "ssl"}
    # The MLflow tracker (driver only) probes the user's own tracking server with one outbound
    # TCP connection before MLflow's long HTTP retries; it may import socket, but never listen.
    outbound_only = {os.path.join(root, "engine", "fit", "reports", "mlflow_tracking.py"):
                     {"socket"}}
    listening = {"bind", "listen", "accept", "create_server", "socketpair"}
    files = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names)
    assert len([f for f in files if f.endswith(".py")]) > 40      # every subpackage is read
    for name in files:
        if name.endswith(".py"):
            tree = ast.parse(open(name).read())
            allowed = outbound_only.get(name, set())
            if allowed:
                calls = {n.func.attr for n in ast.walk(tree)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
                assert not calls & listening, (name, calls & listening)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    mods = [node.module or ""]
                else:
                    continue
                assert not ({m.split(".")[0] for m in mods} & networking) - allowed, (name, mods)
