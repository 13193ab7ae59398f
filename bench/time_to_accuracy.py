"""Time to accuracy, in MLPerf's manner: local rounds against synchronous SGD and
TorchDistributor on T1-T3 (../shared/docs/benchmarks.md; issue "Local rounds").

    python bench/time_to_accuracy.py race                      # T1 T2 T3, every runner, 3 seeds
    python bench/time_to_accuracy.py race --workloads T2 --seeds 0 --runners single rounds
    python bench/time_to_accuracy.py grid --workloads T1 T2    # H x outer on a validation split
    python bench/time_to_accuracy.py compute                   # a round's compute vs plain torch

``race``: the wall time from the fit's call to the end of the first evaluation at or above the
workload's target, median over seeds. It includes each runner's own start (TorchDistributor's
launch and its ranks' data loading, sparkdl's shard build); the SparkSession is shared and
excluded, as is building the input RDD (the driver pickling the arrays). Every runner evaluates
the test split at every epoch's end (sparkdl: its validation; TorchDistributor: each rank half of
the test split, summed), and the evaluation time counts. Runners: ``single`` (plain PyTorch, one
process, 2 threads), ``td-sync`` (TorchDistributor, 2 gloo ranks, DDP), ``td-postlocal``
(TorchDistributor with PyTorch's ``PostLocalSGDOptimizer`` and ``PeriodicModelAverager`` at the
rounds' H and warm-up), ``sync`` (sparkdl, local[2]) and ``rounds`` (sparkdl, local[2], the H,
outer optimizer and warm-up chosen by ``grid`` on a validation split: ``CHOSEN``). All take the
same batches (sparkdl's BatchPlan over two partitions). Also printed: each runner's accuracy
after the workload's epochs (``--full``) and sparkdl's fixed cost (the fit's call to the log
line that starts its training: the checks, the shard build, the dry run, the model shipped),
cold (the first fit of the process) and warm.

``grid``: H in {1, 4, 16, 64} x outer in {average, nesterov} (and sync), one seed, trained on
the training split less its last 10% and evaluated on that 10% (never the test split): the
accuracy after the workload's epochs and the time to the target. What the README's guidance
and ``CHOSEN`` come from.

``compute``: LeNet-5 rounds of H = 16 and 64 steps at 128 samples per partition: the slowest
round task's compute on local[2] (unpickling the model and its state, the steps, the delta and
the state pickled back) against the same steps in two plain Python processes at once (one
thread each), side by side, interleaved.
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sparkdl.data.batch_plan import BatchPlan  # noqa: E402
from sparkdl.datasets import lenet5, mlp  # noqa: E402

PARTITIONS = 2


# ------------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    name: str
    batch: int
    epochs: int
    target: float                # test accuracy to reach (T3: see WORKLOADS)
    optimizer: str               # "adam:<lr>" or "sgd:<lr>:<momentum>"

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        kind, *args = self.optimizer.split(":")
        if kind == "adam":
            return torch.optim.Adam(params, lr=float(args[0]))
        return torch.optim.SGD(params, lr=float(args[0]), momentum=float(args[1]))


WORKLOADS = {
    "T1": Workload("T1", 512, 10, 0.845, "adam:0.005"),
    "T2": Workload("T2", 256, 5, 0.89, "adam:0.002"),
    # T3's target, fixed: single-process torch's median test accuracy after 3 epochs (seeds
    # 0-2: 0.8332, 2026-11-28) minus one point. A race with the single runner prints it again.
    "T3": Workload("T3", 128, 3, 0.8232, "sgd:0.01:0.9"),
}

CHOSEN = {"T1": (64, "average", 0), "T2": (64, "average", 0), "T3": (64, "nesterov", 0)}
"""The rounds' (H, outer optimizer, warm-up) per workload, chosen by ``grid`` on the validation
split (bench/RESULTS.md, local rounds)."""


def model_for(name: str, width: int) -> torch.nn.Module:
    if name == "T1":
        return torch.nn.Sequential(torch.nn.Linear(width, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 2))
    if name == "T2":
        return lenet5()
    return mlp([784, 4096, 4096, 10])


_DATA: dict[str, Any] = {}


def load(name: str, spark: Any = None) -> tuple[np.ndarray, ...]:
    """(train x, train y, test x, test y) as float32 / int64 arrays."""
    if name in _DATA:
        return _DATA[name]
    if name == "T1":
        from pyspark.ml import Pipeline

        from sparkdl.datasets import adult_feature_stages, adult_paths, read_adult
        train_path, test_path = adult_paths()
        train, test = read_adult(spark, train_path), read_adult(spark, test_path)
        prepared = Pipeline(stages=adult_feature_stages("features")).fit(train)

        def arrays(df: Any) -> tuple[np.ndarray, np.ndarray]:
            rows = prepared.transform(df).select("features", "label").collect()
            return (np.stack([r.features.toArray() for r in rows]).astype(np.float32),
                    np.array([int(r.label) for r in rows], dtype=np.int64))
        out = (*arrays(train), *arrays(test))
    else:
        from sparkdl.datasets.fashion_mnist import load_fashion_mnist
        xtr, ytr, xte, yte = load_fashion_mnist(standardize=True)
        if name == "T3":
            xtr, ytr = xtr[:10000].reshape(-1, 784), ytr[:10000]
            xte = xte.reshape(-1, 784)
        out = (xtr, ytr, xte, yte)
    _DATA[name] = out
    return out


def validation_split(data: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The training split less its last 10% for training, that 10% for evaluation."""
    xtr, ytr = data[0], data[1]
    cut = len(ytr) - len(ytr) // 10
    return xtr[:cut], ytr[:cut], xtr[cut:], ytr[cut:]


def sizes_for(n: int) -> list[int]:
    """The partition sizes of ``sc.parallelize(rows, 2)`` (pyspark slices its batches of up
    to 1024 rows): every runner's batch plan uses them."""
    batch = max(1, min(n // PARTITIONS, 1024))
    batches = -(-n // batch)
    first = min(n, (batches // PARTITIONS) * batch)
    return [first, n - first]


def plan_for(w: Workload, n: int, seed: int) -> BatchPlan:
    return BatchPlan(sizes_for(n), w.batch, seed)


def accuracy(net: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    net.eval()
    correct = 0
    with torch.no_grad():
        for a in range(0, len(y), 4096):
            out = net(torch.from_numpy(x[a:a + 4096]))
            correct += int((out.argmax(1) == torch.from_numpy(y[a:a + 4096])).sum())
    net.train()
    return correct, len(y)


@dataclass
class Run:
    """One run: ``evals`` (seconds since the fit's call, accuracy) at every epoch's end."""

    evals: list[tuple[float, float]] = field(default_factory=list)
    fixed_s: float = math.nan
    jobs: int = 0

    def time_to(self, target: float) -> float:
        return next((t for t, a in self.evals if a >= target), math.inf)

    @property
    def final(self) -> float:
        return self.evals[-1][1] if self.evals else math.nan


# ------------------------------------------------------------------------- single process
def _single(w: Workload, data: tuple[np.ndarray, ...], seed: int, target: float, full: bool,
            queue: Any) -> None:
    torch.set_num_threads(2)
    start = time.perf_counter()
    xtr, ytr, xte, yte = data
    torch.manual_seed(seed)
    net = model_for(w.name, xtr.shape[1])
    opt = w.make_optimizer(net.parameters())
    plan = plan_for(w, len(ytr), seed)
    xs, ys = torch.from_numpy(xtr), torch.from_numpy(ytr)
    run = Run()
    for t in range(w.epochs * plan.iterations_per_epoch):
        epoch, step = plan.epoch_and_step(t)
        idx = torch.from_numpy(plan.global_indices(epoch, step))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx]).backward()
        opt.step()
        if step == plan.iterations_per_epoch - 1:
            correct, n = accuracy(net, xte, yte)
            run.evals.append((time.perf_counter() - start, correct / n))
            if not full and correct / n >= target:
                break
    queue.put(run)


def run_single(w: Workload, data: tuple[np.ndarray, ...], seed: int, target: float,
               full: bool, **_: Any) -> Run:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_single, args=(w, data, seed, target, full, queue))
    proc.start()
    try:
        return queue.get(timeout=3600)
    finally:
        proc.join()


# ------------------------------------------------------------------------ TorchDistributor
def _ddp(w: Workload, path: str, seed: int, target: float, full: bool, postlocal: bool,
         local_steps: int, warmup: int, started: float) -> list[tuple[float, float]]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = np.load(path)
    xtr, ytr, xte, yte = data["xtr"], data["ytr"], data["xte"], data["yte"]
    torch.manual_seed(seed)
    net = DistributedDataParallel(model_for(w.name, xtr.shape[1]))
    inner = w.make_optimizer(net.parameters())
    opt: Any = inner
    if postlocal:
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        # after the warm-up no gradient is averaged (each rank its own subgroup: the hook's
        # "local" allreduce is over one rank); the averager averages the models every H steps
        alone, _ = dist.new_subgroups(group_size=1)
        net.register_comm_hook(PostLocalSGDState(None, alone, start_localSGD_iter=warmup),
                               post_localSGD_hook)
        opt = PostLocalSGDOptimizer(inner, PeriodicModelAverager(local_steps, warmup))
    plan = plan_for(w, len(ytr), seed)
    xs, ys = torch.from_numpy(xtr), torch.from_numpy(ytr)
    half = len(yte) // 2                       # each rank evaluates half the test split
    mine = slice(0, half) if rank == 0 else slice(half, len(yte))
    evals: list[tuple[float, float]] = []
    for t in range(w.epochs * plan.iterations_per_epoch):
        epoch, step = plan.epoch_and_step(t)
        idx = torch.from_numpy(plan.offsets[rank] + plan.local_indices(epoch, step, rank))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
        (loss * (len(idx) * PARTITIONS / plan.batch_size_at(step))).backward()
        opt.step()
        if step == plan.iterations_per_epoch - 1:
            correct, _ = accuracy(net.module, xte[mine], yte[mine])
            total = torch.tensor([float(correct)])
            dist.all_reduce(total)
            evals.append((time.time() - started, float(total) / len(yte)))
            if not full and evals[-1][1] >= target:
                break
    # DDP's reducer dropped while the process group lives (at the interpreter's exit, its
    # group's destructor waits on gloo threads that wait for the GIL: a rank hangs)
    del net, opt, inner
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return evals


def run_td(w: Workload, data: tuple[np.ndarray, ...], seed: int, target: float, full: bool,
           postlocal: bool = False, **_: Any) -> Run:
    from compare_runners import TD_TIMEOUT_S, _kill_torchrun_after
    from pyspark.ml.torch.distributor import TorchDistributor

    local_steps, _, warmup = CHOSEN[w.name]
    done = threading.Event()
    threading.Thread(target=_kill_torchrun_after, args=(max(TD_TIMEOUT_S, 1800), done),
                     daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.npz")
        np.savez(path, xtr=data[0], ytr=data[1], xte=data[2], yte=data[3])
        try:
            started = time.time()
            evals = TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                     use_gpu=False).run(_ddp, w, path, seed, target, full,
                                                        postlocal, local_steps, warmup, started)
        finally:
            done.set()
    return Run(evals=list(evals))


# ----------------------------------------------------------------------------------- sparkdl
class _Watch:
    """End trigger: records when each validation ends, stops at the target unless ``full``,
    else after the epochs."""

    def __init__(self, started: float, target: float, epochs: int, full: bool) -> None:
        from sparkdl.triggers import MaxEpoch, Trigger

        class Watch(Trigger):
            def __call__(inner, state: Any) -> bool:
                now = time.perf_counter() - started
                if state.validated:
                    acc = state.metrics["Top1Accuracy"]
                    self.evals.append((now, acc))
                    if not full and acc >= target:
                        return True
                return MaxEpoch(epochs)(state)

            def metric_names(inner) -> set[str]:
                return {"Top1Accuracy"}

        self.trigger = Watch()
        self.evals: list[tuple[float, float]] = []


def run_sparkdl(w: Workload, data: tuple[np.ndarray, ...], seed: int, target: float,
                full: bool, sc: Any = None, local_steps: int = 1, outer: Any = None,
                warmup: int = 0, **_: Any) -> Run:
    from sparkdl import DistriOptimizer, Top1Accuracy
    from sparkdl.triggers import EveryEpoch

    xtr, ytr, xte, yte = data
    rdd = sc.parallelize(list(zip(xtr, ytr)), PARTITIONS)
    test = sc.parallelize(list(zip(xte, yte)), PARTITIONS)
    assert rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect() == \
        sizes_for(len(ytr))
    import logging

    opened: list[float] = []       # when the fit is opened (its data held, the model shipped)
    handler = logging.Handler()
    handler.emit = lambda r: opened.append(r.created) if (  # type: ignore[method-assign]
        not opened and r.getMessage().startswith("training on")) else None
    logging.getLogger("sparkdl").addHandler(handler)
    logging.getLogger("sparkdl").setLevel(logging.INFO)
    torch.manual_seed(seed)
    started, wall_started = time.perf_counter(), time.time()
    net = model_for(w.name, xtr.shape[1])
    watch = _Watch(started, target, w.epochs, full)
    opt = DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(),
                          w.make_optimizer(net.parameters()), batch_size=w.batch,
                          end_trigger=watch.trigger, seed=seed, progress_bar=False,
                          local_steps=local_steps, outer_optimizer=outer, sync_warmup=warmup)
    opt.set_validation(test, EveryEpoch(), [Top1Accuracy()], batch_size=4096)
    try:
        opt.optimize()
    finally:
        logging.getLogger("sparkdl").removeHandler(handler)
    fixed = opened[0] - wall_started if opened else math.nan
    rdd.unpersist()
    test.unpersist()
    return Run(evals=watch.evals, fixed_s=fixed)


RUNNERS: dict[str, Callable[..., Run]] = {
    "single": run_single,
    "td-sync": run_td,
    "td-postlocal": lambda *a, **k: run_td(*a, postlocal=True, **k),
    "sync": run_sparkdl,
    "rounds": lambda w, *a, **k: run_sparkdl(w, *a, **{**k, **dict(zip(
        ("local_steps", "outer", "warmup"), CHOSEN[w.name]))}),
}


def spark_session(extra: dict[str, str] | None = None) -> Any:
    """local[2] as sparkdl's users start it (sparkdl.spark_settings.spark_session: its
    recommended settings, the local JVM at HotSpot's quick compiler), with ``extra`` settings."""
    from sparkdl.spark_settings import spark_session as recommended

    spark = recommended("time to accuracy", "local[2]", {
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "6g", "spark.driver.maxResultSize": "2g", **(extra or {})})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def t3_target(runs: list[Run]) -> float:
    """T3's target: single-process torch's test accuracy after 3 epochs, median of its
    seeds, minus one point."""
    return statistics.median(r.evals[2][1] for r in runs) - 0.01


def race(args: Any) -> None:
    spark = spark_session()
    fixed: list[tuple[str, float]] = []
    for name in args.workloads:
        w = WORKLOADS[name]
        data = load(name, spark)
        results: dict[str, list[Run]] = {}
        runners = list(args.runners)
        for runner in runners:
            seeds = args.sync_seeds if runner == "sync" and args.sync_seeds else args.seeds
            for seed in seeds:
                target = w.target
                full = args.full or (name == "T3" and runner == "single")
                run = RUNNERS[runner](w, data, seed, target, full, sc=spark.sparkContext)
                results.setdefault(runner, []).append(run)
                if runner in ("sync", "rounds"):
                    fixed.append((f"{name} {runner}", run.fixed_s))
                print(f"# {name} {runner} seed {seed}: evals "
                      f"{[(round(t, 1), round(a, 4)) for t, a in run.evals]} fixed "
                      f"{run.fixed_s:.2f} s", flush=True)
            if name == "T3" and runner == "single":
                print(f"# T3's target from these single-process runs: "
                      f"{t3_target(results['single']):.4f} (fixed: {w.target})", flush=True)
        target = w.target
        times = {r: statistics.median(run.time_to(target) for run in rs)
                 for r, rs in results.items()}
        print(f"\n{name} (target {target:.4f}, H, outer, warm-up {CHOSEN[name]}; median of "
              f"seeds {args.seeds})")
        print("| runner | time to target (s) | rounds faster by | accuracy at the end |")
        print("|---|---:|---:|---:|")
        rounds_time = times.get("rounds", math.nan)
        for r, t in times.items():
            finals = statistics.median(run.final for run in results[r])
            print(f"| {r} | {t:.1f} | {t / rounds_time:.2f}x | {finals:.4f} |")
    print("\nsparkdl fixed cost (fit call to first iteration), in run order (the first: cold):")
    for what, s in fixed:
        print(f"  {what}: {s:.2f} s")
    spark.stop()


def grid(args: Any) -> None:
    spark = spark_session()
    for name in args.workloads:
        w = WORKLOADS[name]
        data = validation_split(load(name, spark))
        target = args.t3_target or w.target
        rows = []
        sync = (run_sparkdl(w, data, args.seeds[0], target, True, sc=spark.sparkContext)
                if not args.no_sync else Run(evals=[(math.nan, math.nan)]))
        rows.append(("sync", "", sync))
        print(f"# {name} sync: {[(round(t, 1), round(a, 4)) for t, a in sync.evals]}",
              flush=True)
        for h in args.local_steps:
            for outer in ("average", "nesterov"):
                run = run_sparkdl(w, data, args.seeds[0], target, True, sc=spark.sparkContext,
                                  local_steps=h, outer=outer, warmup=args.warmup)
                rows.append((f"H={h}", outer, run))
                print(f"# {name} H={h} {outer}: {[(round(t, 1), round(a, 4)) for t, a in run.evals]}",
                      flush=True)
        print(f"\n{name} on the validation split (target {target:.4f}, {w.epochs} epochs, seed "
              f"{args.seeds[0]}, warm-up {args.warmup})")
        print("| run | outer | accuracy after the epochs | vs sync (points) | time to target (s) |"
              " time vs sync |")
        print("|---|---|---:|---:|---:|---:|")
        for label, outer, run in rows:
            tt = run.time_to(target)
            print(f"| {label} | {outer} | {run.final:.4f} | {100 * (run.final - sync.final):+.2f}"
                  f" | {tt:.1f} | {sync.time_to(target) / tt if tt else math.nan:.2f}x |")
    spark.stop()


# --------------------------------------------------------------------------------- compute
CHUNKS = 8
"""Rounds per compute measurement (the first one left out, as warm-up)."""


def _plain_steps(steps: int, rows: int, seed: int, queue: Any, barrier: Any) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    net = lenet5()
    opt = torch.optim.Adam(net.parameters(), lr=0.002)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(steps * rows, 1, 28, 28)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, steps * rows))
    for warm in range(2):                 # the same shapes once, as a task's first round does
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[:rows]), y[:rows]).backward()
        opt.step()
    barrier.wait()
    per_chunk = []
    xn, yn = x.numpy(), y.numpy()
    for chunk in range(CHUNKS):           # as many "rounds" as sparkdl's, each timed
        start, cpu = time.perf_counter(), time.thread_time()
        order = rng.permutation(steps * rows)      # an epoch of the shard, as a round takes
        for s in range(steps):
            idx = order[s * rows:(s + 1) * rows]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(torch.from_numpy(xn[idx])),
                                              torch.from_numpy(yn[idx])).backward()
            opt.step()
        per_chunk.append(((time.perf_counter() - start) / steps,
                          (time.thread_time() - cpu) / steps))
    queue.put((statistics.median(c[0] for c in per_chunk[1:]),
               statistics.median(c[1] for c in per_chunk[1:])))


def plain_two_at_once(steps: int, rows: int) -> tuple[float, float]:
    """Seconds per step (wall, the thread's CPU), the slower of two plain processes running
    the same steps at once."""
    ctx = multiprocessing.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_plain_steps, args=(steps, rows, k, queue, barrier))
             for k in range(2)]
    for p in procs:
        p.start()
    out = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return max(o[0] for o in out), max(o[1] for o in out)


def compute(args: Any) -> None:
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    spark = spark_session()
    sc = spark.sparkContext
    rows = 128
    from sparkdl.engine.strategies.rounds import jobs as round_jobs

    reports: list[Any] = []
    complete = round_jobs.RoundMember.complete

    def keep_reports(member: Any, result: Any, job_s: float) -> bool:   # instrumentation
        reports.append(result.reports)
        return complete(member, result, job_s)

    round_jobs.RoundMember.complete = keep_reports
    rng = np.random.default_rng(0)
    lines = []
    for steps in args.local_steps:
        n = 2 * rows * steps
        x = rng.normal(size=(n, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, n).astype(np.int64)
        rdd = sc.parallelize(list(zip(x, y)), PARTITIONS)
        sparkdl_s, plain_s = [], []
        for repeat in range(args.repeats):
            plain_s.append(plain_two_at_once(steps, rows))
            reports.clear()
            torch.manual_seed(0)
            net = lenet5()
            opt = DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(),
                                  torch.optim.Adam(net.parameters(), lr=0.002),
                                  batch_size=2 * rows, end_trigger=MaxIteration(CHUNKS * steps),
                                  seed=0, progress_bar=False, local_steps=steps)
            opt.optimize()
            # each round's slowest task (the first round warms up), wall and thread CPU
            slowest = [max(rs, key=lambda r: r.compute_s) for rs in reports[1:]]
            sparkdl_s.append((statistics.median(r.compute_s for r in slowest) / steps,
                              statistics.median(r.cpu_s for r in slowest) / steps,
                              statistics.median(r.compute_s - r.steps_s for r in slowest)))
            print(f"# H={steps} repeat {repeat}: plain {1000 * plain_s[-1][0]:.1f} ms/step "
                  f"(CPU {1000 * plain_s[-1][1]:.1f}), sparkdl round task "
                  f"{1000 * sparkdl_s[-1][0]:.1f} ms/step (CPU {1000 * sparkdl_s[-1][1]:.1f}; "
                  f"fixed {1000 * sparkdl_s[-1][2]:.0f} ms per round)", flush=True)
        rdd.unpersist()
        p = [statistics.median(v[k] for v in plain_s) for k in range(2)]
        s = [statistics.median(v[k] for v in sparkdl_s) for k in range(3)]
        lines.append(f"| {steps} | {1000 * p[0]:.1f} | {1000 * s[0]:.1f} | {s[0] / p[0]:.2f}x | "
                     f"{1000 * p[1]:.1f} | {1000 * s[1]:.1f} | {s[1] / p[1]:.2f}x | "
                     f"{1000 * s[2]:.0f} |")
    round_jobs.RoundMember.complete = complete
    print(f"\nLeNet-5, {rows} samples per step, 2 partitions at once (local[2]) against two "
          f"plain processes at once (one thread each); per step, medians of {args.repeats} "
          f"repeats of rounds 2-{CHUNKS} (each round's slower task):")
    print("| H | plain wall (ms/step) | round task wall | ratio | plain CPU | round task CPU | "
          "ratio | the round task's fixed cost (ms per round) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["race", "grid", "compute"])
    parser.add_argument("--workloads", nargs="+", default=["T1", "T2", "T3"])
    parser.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=list(RUNNERS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--no-sync", action="store_true",
                        help="grid: leave sparkdl sync out (its row is empty)")
    parser.add_argument("--sync-seeds", nargs="+", type=int, default=None,
                        help="race: the seeds of sparkdl sync (default: --seeds)")
    parser.add_argument("--full", action="store_true",
                        help="train every run for the workload's epochs (final accuracy)")
    parser.add_argument("--local-steps", nargs="+", type=int, default=None,
                        help="grid: [1, 4, 16, 64]; compute: [16, 64]")
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--t3-target", type=float, default=0.0,
                        help="grid: T3's target on the validation split (default: the race's)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.local_steps is None:
        args.local_steps = [16, 64] if args.mode == "compute" else [1, 4, 16, 64]
    {"race": race, "grid": grid, "compute": compute}[args.mode](args)


if __name__ == "__main__":
    main()
