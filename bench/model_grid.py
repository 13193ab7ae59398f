"""Tuning grids G1 and G2 (../shared/docs/benchmarks.md): many models over one dataset, total
wall time from a fresh process to the last model, each way of tuning in a process of its own.

    python bench/model_grid.py                       # G1, every runner
    python bench/model_grid.py --grid G2 --runners together one-by-one trials
    python bench/model_grid.py --grid G1 --settings 4 --epochs 1     # a quick look
    python bench/model_grid.py --runners together --conf spark.task.maxDirectResultSize=64m
    python bench/model_grid.py --runners hop trials torchdistributor --samples 327680 \
        --conf spark.driver.memory=6g                # the large-data row (40x G1's samples)

Runners:
  together          sparkdl's set of fits (sparkdl.FitSet): one pass, one job per iteration
  hop               sparkdl's set of fits by model hopping (FitSet(strategy="hop")): whole
                    models trained where the data sits, one job per sub-epoch
  one-by-one        sparkdl fitting the settings one after another (each its own data hold)
  trials            single-process trials as Spark tasks two at a time, the data in a broadcast
                    (the way Hyperopt's SparkTrials runs trials)
  torchdistributor  TorchDistributor(num_processes=2, local_mode=True) per setting, one after
                    another, each reading its data from a file (as its documentation does)

Every runner trains every setting on the same union batches (sparkdl's BatchPlan) from the same
initial weights, so the final losses agree across runners (printed beside the times). For the
pass it also prints, per iteration: the wall time, the slowest task's compute (all models), each
model's share of it, the bare Spark floor (an empty two-stage job, timed in the same session),
the bytes the AllReduce and the broadcasts move, and the exchange floor: those bytes moved by
sparkdl's broadcast and driver AllReduce without any compute (timed in the same session).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import (MOMENTUM, PARTITIONS, SAMPLES, SEED, WORKLOADS,  # noqa: E402
                             spark_floor, synthetic_data)
from sparkdl.data.batch_plan import BatchPlan  # noqa: E402

GRIDS = {"G1": ("W1", 3), "G2": ("W2", 10)}
LRS = (0.003, 0.01, 0.03, 0.1)
WEIGHT_DECAYS = (0.0, 1e-5, 1e-4, 1e-3)
RUNNERS = ("together", "hop", "one-by-one", "trials", "torchdistributor")
SCALE = {"samples": SAMPLES}
"""The number of samples of this run (``--samples``; G1 and G2 have SAMPLES)."""


def settings(count: int) -> list[tuple[float, float]]:
    return [(lr, wd) for lr in LRS for wd in WEIGHT_DECAYS][:count]


def plan(batch: int) -> BatchPlan:
    return BatchPlan([SCALE["samples"] // PARTITIONS] * PARTITIONS, batch, SEED, True)


def _chunk(partition: int) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_data(SCALE["samples"] // PARTITIONS, seed=100 + partition)


def bench_data() -> tuple[np.ndarray, np.ndarray]:
    """The run's samples: G1/G2's, or for another ``--samples`` one chunk per partition
    (what :func:`bench_rdd` generates in the executors), concatenated."""
    if SCALE["samples"] == SAMPLES:
        return synthetic_data()
    chunks = [_chunk(p) for p in range(PARTITIONS)]
    return (np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]))


def bench_rdd(sc: Any) -> Any:
    """The run's samples as an RDD of ``PARTITIONS`` partitions: G1/G2's parallelized from the
    driver, a larger run's generated where the data lives (each partition its chunk)."""
    if SCALE["samples"] == SAMPLES:
        x, y = synthetic_data()
        return sc.parallelize(list(zip(x, y)), PARTITIONS)
    samples = SCALE["samples"]

    def rows(partition: int, _: Any) -> Any:
        SCALE["samples"] = samples
        x, y = _chunk(partition)
        return iter(zip(x, y))

    return sc.parallelize(range(PARTITIONS), PARTITIONS).mapPartitionsWithIndex(rows)


def session() -> Any:
    """The local[2] session every runner uses, with the ``--conf`` settings of the command
    (``SPARKDL_BENCH_CONF``: ``key=value`` pairs separated by spaces)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    here = os.path.dirname(os.path.abspath(__file__))      # the workers import this module's
    os.environ["PYTHONPATH"] = os.pathsep.join(              # helpers (compare_runners)
        [here, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

    builder = (SparkSession.builder.master(f"local[{PARTITIONS}]").appName("model_grid")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.python.unix.domain.socket.enabled", "true"))
    for pair in os.environ.get("SPARKDL_BENCH_CONF", "").split():    # after the defaults:
        key, _, value = pair.partition("=")                           # they win
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _fits(workload: Any, rdd: Any, grid: list[tuple[float, float]], epochs: int) -> list[Any]:
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxEpoch

    fits = []
    for lr, wd in grid:
        net = workload.model()
        fits.append(DistriOptimizer(
            net, rdd, torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(net.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=wd),
            batch_size=workload.batch, end_trigger=MaxEpoch(epochs), seed=SEED,
            progress_bar=False))
    return fits


class _VectorBack:
    """An exchange-floor task: reads the weights' broadcast (as a pass's task does), computes
    nothing, returns a vector of the pass's length (as a pass's task returns its fits')."""

    def __init__(self, weights: Any, values: int) -> None:
        self.weights, self.values = weights, values

    def __call__(self, partition: int, summary: Any) -> tuple[np.ndarray, Any]:
        from sparkdl.executor.step import TaskReport

        assert self.weights.value.size == self.values
        return np.zeros(self.values, dtype=np.float32), TaskReport(partition=partition)


def exchange_floor(sc: Any, values: int, repeats: int = 10) -> float:
    """Median seconds of what a pass's iteration moves, through sparkdl's own transport,
    without its compute: ``values`` float32 weights broadcast and read by every task, and every
    task's vector of ``values`` summed by the driver AllReduce, over ``PARTITIONS``
    partitions."""
    from sparkdl.transport.allreduce import DriverAllReduce
    from sparkdl.transport.python_jobs import PythonJobs

    rdd = sc.parallelize(range(PARTITIONS), PARTITIONS).cache()
    rdd.count()
    allreduce = DriverAllReduce(values, np.float32)
    jobs = PythonJobs.of(sc)
    payload = np.zeros(values, dtype=np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        bc = jobs.broadcast(payload)
        result = allreduce.run(rdd, _VectorBack(bc, values))
        times.append(time.perf_counter() - t0)
        assert result.vector is not None and result.vector.size == values
        bc.destroy()
    rdd.unpersist()
    return statistics.median(times)


def run_sparkdl(workload: Any, grid: list[tuple[float, float]], epochs: int,
                together: bool, hop: bool = False) -> dict[str, Any]:
    from sparkdl import FitSet

    spark = session()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    rdd = bench_rdd(sc)
    fits = _fits(workload, rdd, grid, epochs)
    if hop:
        return _hop(spark, fits)
    out: dict[str, Any] = {}
    if together:          # the bare Spark floor, before the pass (not in the timed total)
        t0 = time.perf_counter()
        values = sum(f.layout.size for f in fits)
        out["floor_s"] = spark_floor(sc, 4 * values)[0]
        out["not_timed_s"] = time.perf_counter() - t0
    if together:
        FitSet(fits).run()
    else:
        for fit in fits:
            fit.optimize()
    out["final_losses"] = [f.summary.iterations[-1].loss for f in fits]
    if together:          # after the pass, on the JVM and workers it warmed (not timed either)
        t0 = time.perf_counter()
        out["exchange_s"] = exchange_floor(sc, values)
        out["not_timed_s"] += time.perf_counter() - t0
    if together:
        records = fits[0].summary.iterations
        out["iteration_s"] = statistics.median(r.wall_s for r in records)
        out["model_compute_s"] = statistics.median(r.compute_s for r in records)
        out["allreduce_bytes"] = 4 * values * PARTITIONS
        out["broadcast_bytes"] = 4 * values
    spark.stop()
    return out


def _hop(spark: Any, fits: list[Any]) -> dict[str, Any]:
    """The fits trained by model hopping, with what an epoch costs: its jobs, the bytes it
    moves (every model and optimizer shipped in each sub-epoch's broadcast, their states
    returned) and the tasks' compute as a share of the wall time of both cores."""
    import pickle

    from pyspark import cloudpickle

    from sparkdl import FitSet
    from sparkdl.executor.hop_task import HopBundle
    from sparkdl.executor.replicas import ReplicaSpec

    fit_set = FitSet(fits, strategy="hop")
    t0 = time.perf_counter()
    fit_set.run()
    hop_s = time.perf_counter() - t0
    out: dict[str, Any] = {"final_losses": [f.summary.iterations[-1].loss for f in fits]}
    epochs = fits[0].iteration // PARTITIONS
    shipped = len(cloudpickle.dumps(HopBundle(ReplicaSpec(fits[0].model, fits[0].criterion,
                                                          "mean"), fits[0].optimizer)))
    returned = len(pickle.dumps((fits[0].model.state_dict(), fits[0].optimizer.state_dict(),
                                 None)))
    out["hop_jobs_per_epoch"] = fit_set.jobs / epochs
    # each job: every model's bundle in a broadcast every task's worker reads, states back
    out["hop_bytes_per_epoch"] = (fit_set.jobs * len(fits) * (PARTITIONS * shipped + returned)
                                  / epochs)
    compute = sum(r.compute_s for f in fits for r in f.summary.iterations)
    out["hop_compute_share"] = compute / (PARTITIONS * hop_s)
    out["hop_s"] = hop_s
    spark.stop()
    return out


def _trial(args: tuple[Any, ...]) -> float:
    """One setting trained in this process on the union batches; its last batch's loss."""
    workload, data, lr, wd, epochs = args
    torch.set_num_threads(1)
    x, y = (torch.from_numpy(a) for a in data)
    net = workload.model()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=wd)
    p = plan(workload.batch)
    loss = torch.tensor(0.0)
    for t in range(p.iterations_per_epoch * epochs):
        idx = torch.from_numpy(p.global_indices(*p.epoch_and_step(t)))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
    return float(loss)


def run_trials(workload: Any, grid: list[tuple[float, float]], epochs: int) -> dict[str, Any]:
    spark = session()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    data = sc.broadcast(bench_data())
    samples = SCALE["samples"]

    def trial(kv: Any) -> tuple[int, float]:
        SCALE["samples"] = samples
        return kv[0], _trial((workload, data.value, kv[1][0], kv[1][1], epochs))

    losses = sc.parallelize(list(enumerate(grid)), len(grid)).map(trial).collect()
    spark.stop()
    return {"final_losses": [loss for _, loss in sorted(losses)]}


def _ddp_trial(workload: Any, path: str, lr: float, wd: float, epochs: int,
               samples: int = SAMPLES) -> float:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    SCALE["samples"] = samples
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = np.load(path)
    xs, ys = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    net = DistributedDataParallel(workload.model())
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=wd)
    p, loss = plan(workload.batch), 0.0
    for t in range(p.iterations_per_epoch * epochs):
        epoch, step = p.epoch_and_step(t)
        idx = torch.from_numpy(p.offsets[rank] + p.local_indices(epoch, step, rank))
        opt.zero_grad()
        out = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
        (out * len(idx) / p.batch_size_at(step) * PARTITIONS).backward()   # the union's mean
        opt.step()
        total = torch.tensor([float(out.detach()) * len(idx)])
        dist.all_reduce(total)
        loss = float(total) / p.batch_size_at(step)
    dist.destroy_process_group()
    return loss


def run_torch_distributor(workload: Any, grid: list[tuple[float, float]],
                          epochs: int) -> dict[str, Any]:
    from pyspark.ml.torch.distributor import TorchDistributor

    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    losses = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.npz")
        x, y = bench_data()
        np.savez(path, x=x, y=y)
        del x, y
        for lr, wd in grid:
            losses.append(TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                           use_gpu=False).run(_ddp_trial, workload, path, lr,
                                                              wd, epochs, SCALE["samples"]))
    spark.stop()
    return {"final_losses": losses}


def one_runner(runner: str, grid_name: str, count: int, epochs: int | None) -> dict[str, Any]:
    name, default_epochs = GRIDS[grid_name]
    workload, epochs = WORKLOADS[name], epochs or default_epochs
    grid = settings(count)
    start = time.perf_counter()
    if runner in ("together", "one-by-one", "hop"):
        out = run_sparkdl(workload, grid, epochs, runner == "together", runner == "hop")
    elif runner == "trials":
        out = run_trials(workload, grid, epochs)
    else:
        out = run_torch_distributor(workload, grid, epochs)
    out["wall_s"] = time.perf_counter() - start
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", choices=sorted(GRIDS), default="G1")
    p.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS))
    p.add_argument("--settings", type=int, default=16, help="the first N settings of the grid")
    p.add_argument("--epochs", type=int, help="default: the grid's (G1 3, G2 10)")
    p.add_argument("--conf", nargs="+", default=[], metavar="KEY=VALUE",
                   help="Spark settings for every runner's session")
    p.add_argument("--samples", type=int, default=SAMPLES,
                   help=f"samples (default {SAMPLES}); another number generates each "
                        "partition's chunk where it lives")
    p.add_argument("--one", choices=RUNNERS, help=argparse.SUPPRESS)   # a child process
    args = p.parse_args()
    SCALE["samples"] = args.samples
    if args.conf:
        os.environ["SPARKDL_BENCH_CONF"] = " ".join(args.conf)
    if args.one:
        print(json.dumps(one_runner(args.one, args.grid, args.settings, args.epochs)))
        return
    results = {}
    for runner in args.runners:       # each in a fresh process: its startup counts
        cmd = [sys.executable, os.path.abspath(__file__), "--grid", args.grid, "--settings",
               str(args.settings), "--samples", str(args.samples), "--one", runner] + (
                   ["--epochs", str(args.epochs)] if args.epochs else [])
        wall = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - wall
        if proc.returncode != 0:
            print(f"{runner} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results[runner] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[runner]["process_s"] = wall - results[runner].get("not_timed_s", 0.0)
    name, default_epochs = GRIDS[args.grid]
    print(f"{args.grid}: {args.settings} settings of {name}, {args.epochs or default_epochs} "
          f"epochs, {args.samples} samples, local[{PARTITIONS}]; total wall per runner (a fresh "
          "process each, Python start included)" + (f"; {' '.join(args.conf)}" if args.conf
                                                    else ""))
    lead = "together" if "together" in results else next(iter(results), "")
    base = results.get(lead, {}).get("process_s")
    print(f"| runner | wall s | {lead}'s speed-up | final loss, setting 0 | max loss gap to "
          f"{lead} |")
    print("|---|---:|---:|---:|---:|")
    for runner, out in results.items():
        gap = max(abs(a - b) for a, b in zip(out["final_losses"],
                                              results[lead]["final_losses"]))
        ratio = out["process_s"] / base if base else float("nan")
        print(f"| {runner} | {out['process_s']:.1f} | {ratio:.2f}x | "
              f"{out['final_losses'][0]:.4f} | {gap:.2e} |")
    hop = results.get("hop")
    if hop:
        print(f"\nhop: {hop['hop_jobs_per_epoch']:.2f} jobs per epoch, "
              f"{hop['hop_bytes_per_epoch'] / 2**20:.1f} MiB moved per epoch (models and "
              f"optimizers out to each task's worker, states back), tasks' compute "
              f"{100 * hop['hop_compute_share']:.0f}% of both cores over the "
              f"{hop['hop_s']:.1f} s of training")
    together = results.get("together")
    if together:
        models = args.settings
        print(f"\nthe pass, per iteration (medians): wall {1e3 * together['iteration_s']:.1f} ms; "
              f"one model's compute in a task {1e3 * together['model_compute_s']:.1f} ms "
              f"(x {models} models: {1e3 * models * together['model_compute_s']:.0f} ms, "
              f"{100 * models * together['model_compute_s'] / together['iteration_s']:.0f}% "
              f"of the iteration); Spark's floor (an empty two-stage job) "
              f"{1e3 * together['floor_s']:.1f} ms; AllReduce "
              f"{together['allreduce_bytes'] / 2**20:.1f} MiB in, broadcasts "
              f"{together['broadcast_bytes'] / 2**20:.1f} MiB out; the same bytes moved "
              f"without compute (sparkdl's broadcast read by every task and driver "
              f"AllReduce) {1e3 * together['exchange_s']:.1f} ms")


if __name__ == "__main__":
    main()
