"""The per-iteration jobs built on Spark's JVM classes (sparkdl.transport.python_jobs)."""

from __future__ import annotations

import os
import statistics
import sys
import uuid
import zipfile

import numpy as np
import torch

from models import SmallNet, classification_data, make_rdd
from sparkdl import DistriOptimizer
from sparkdl.transport.frames import collect_messages, keyed_frame, message_frames, read_messages
from sparkdl.transport.python_jobs import JobRdd, PythonJobs, user_call_site
from sparkdl.triggers import MaxIteration

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
from compare_runners import Py4jCounter  # noqa: E402


class _Emit:
    """Each partition's records summed, sent to every reducer with its partition number, and
    the value of a broadcast."""

    def __init__(self, bc, num_blocks):
        self.bc, self.num_blocks = bc, num_blocks

    def __call__(self, partition, records):
        total = float(sum(records)) + self.bc.value
        for k in range(self.num_blocks):
            for frame in message_frames((partition, total), None):
                yield from keyed_frame(k, frame)


class _Gather:
    """A reducer: every (partition, total) it got, in arrival order, and an imported module's
    answer (a module shipped with sc.addPyFile after the first job)."""

    def __init__(self, module=None):
        self.module = module

    def __call__(self, k, frames):
        got = [head for head, _ in read_messages(frames)]
        extra = __import__(self.module).ANSWER if self.module else None
        yield from message_frames((k, got, extra), None)


def test_a_job_built_on_the_jvm_classes_shuffles_frames_like_pysparks_api(sc, tmp_path):
    from sparkdl.transport.frames import shuffle_frames

    jobs = PythonJobs.of(sc)
    assert PythonJobs.of(sc) is jobs
    rdd = sc.parallelize(range(12), 3).cache()
    index = jobs.rdd(rdd)
    bc = jobs.broadcast(100.0)
    try:
        mapped = jobs.map_partitions(index, _Emit(bc, 2))
        shuffled = shuffle_frames(mapped, 2)
        assert isinstance(shuffled, JobRdd)
        out = collect_messages(jobs.map_partitions(shuffled, _Gather()), lambda h: None,
                               "test job")
        expected = [(p, float(sum(range(4 * p, 4 * p + 4))) + 100.0) for p in range(3)]
        assert {h[0]: sorted(h[1]) for h, _ in out} == {0: expected, 1: expected}
        # a module added after the first jobs reaches the workers of the next (in a zip: only
        # the job's list of includes puts it on the workers' path)
        name = f"sparkdl_added_{uuid.uuid4().hex}"
        archive = tmp_path / f"{name}.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr(f"{name}.py", "ANSWER = 42\n")
        sc.addPyFile(str(archive))
        out = collect_messages(jobs.map_partitions(
            shuffle_frames(jobs.map_partitions(index, _Emit(bc, 2)), 2), _Gather(name)),
            lambda h: None, "test job")
        assert [h[2] for h, _ in out] == [42, 42]
    finally:
        bc.destroy(blocking=False)
        rdd.unpersist()


class _Big:
    """A task function whose pickle is over Spark's broadcast threshold (1 MiB by default)."""

    def __init__(self):
        self.weights = np.arange(512 * 1024, dtype=np.float32)     # 2 MiB

    def __call__(self, partition, records):
        yield from message_frames((partition, float(self.weights.sum(dtype=np.float64)),
                                   sum(records)), None)


def test_a_command_over_the_broadcast_threshold_travels_as_a_broadcast(sc):
    jobs = PythonJobs.of(sc)
    rdd = sc.parallelize(range(6), 2).cache()
    try:
        out = collect_messages(jobs.map_partitions(jobs.rdd(rdd), _Big()), lambda h: None,
                               "test job")
        total = float(np.arange(512 * 1024, dtype=np.float64).sum())
        assert sorted(h for h, _ in out) == [(0, total, 3), (1, total, 12)]
    finally:
        rdd.unpersist()


def test_the_call_site_names_the_callers_frame_outside_the_libraries():
    site = user_call_site("sparkdl iteration")
    assert site.startswith("sparkdl iteration at ")
    assert site.split(" at ")[1].startswith("test_python_jobs.py:")


def _fit(sc, allreduce, iterations):
    x, y = classification_data(100, seed=3)
    torch.manual_seed(11)
    net = SmallNet()
    initial = [p.detach().clone() for p in net.parameters()]
    DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [45, 55]), torch.nn.CrossEntropyLoss(),
                    torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9), batch_size=20,
                    end_trigger=MaxIteration(iterations), seed=1, progress_bar=False,
                    allreduce=allreduce).optimize()
    return net, initial


def test_an_iteration_costs_the_driver_few_py4j_round_trips_and_the_same_weights(sc):
    """Built through RDD.mapPartitionsWithIndex(...).collect(), an iteration cost 34 round trips
    on the driver path (bench/RESULTS.md); its jobs, update and broadcasts now take 19 (28 on
    the shuffle path: two stages)."""
    reference = {}
    for path, bound in (("driver", 21), ("shuffle", 30)):      # measured: 19 and 28
        with Py4jCounter() as counter:
            net, initial = _fit(sc, path, 12)
        steps = [b - a for a, b in zip(counter.marks, counter.marks[1:])][2:]
        assert len(steps) == 9 and min(steps) > 5, (path, steps)     # the counter counts
        assert statistics.median(steps) <= bound, (path, steps)
        reference[path] = [p.detach().clone() for p in net.parameters()]
    # both paths sum in partition order: bitwise the same weights
    assert all(torch.equal(a, b) for a, b in zip(reference["driver"], reference["shuffle"]))
    assert not all(torch.equal(a, b) for a, b in zip(reference["driver"], initial))


def test_the_transport_modules_import_one_another_without_a_cycle():
    """Every import between sparkdl.transport's modules, at module level or inside a function,
    follows one order: each piece lives in the module it belongs to, none needs a late
    import to load. (Imports for type checkers alone, under ``if TYPE_CHECKING:``, never run.)"""
    import ast

    import sparkdl.transport

    package = os.path.dirname(sparkdl.transport.__file__)
    modules = {name[:-3] for name in os.listdir(package) if name.endswith(".py")}
    imports = {}
    for module in modules:
        with open(os.path.join(package, module + ".py")) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):       # drop the blocks only type checkers read
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                    and node.test.id == "TYPE_CHECKING":
                node.body = []
        named = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                named |= ({node.module.split(".")[0]} if node.module else
                          {alias.name for alias in node.names})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "sparkdl.transport."):
                named.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                named |= {a.name.split(".")[2] for a in node.names
                          if a.name.startswith("sparkdl.transport.")}
        imports[module] = named & modules
    assert "python_jobs" in imports["frames"]          # the graph is read
    order: list[str] = []
    visiting: list[str] = []

    def visit(module):
        assert module not in visiting, f"import cycle: {' -> '.join(visiting + [module])}"
        if module in order:
            return
        visiting.append(module)
        for other in sorted(imports[module]):
            visit(other)
        visiting.pop()
        order.append(module)

    for module in sorted(modules):
        visit(module)
    assert len(order) == len(modules)
