"""W4: a MovieLens-shaped two-tower recommender with sparse embedding tables, in one run.

    python bench/recommender_scale.py                          # 100k, 1M, 4M item rows
    python bench/recommender_scale.py --items 100000 1000000 --iterations 20 --warmup 3

The model: a user table (100,000 rows) and an item table (``--items`` rows), both
``nn.Embedding(32, sparse=True)``, their product through a 32-64-1 head; MSE on synthetic
ratings; batch 2048 drawn over 65,536 samples whose ids follow a Zipf-like law (a few popular
items, a long tail), as MovieLens' do. SparseAdam (lr 1e-3) for the tables, Adam (lr 1e-3) for
the head; weights from torch.manual_seed(0); the same batches everywhere (sparkdl's BatchPlan).

Runners, interleaved per table size: plain PyTorch in one process (2 threads),
TorchDistributor(num_processes=2, local_mode=True) with DDP over gloo (sparse gradients are
allreduced as sparse tensors) and one thread per process, and sparkdl on local[2] (shuffle
AllReduce: the tables' rows sharded by id range).

Prints samples/s (median iteration after the warm-up), sparkdl / TorchDistributor, sparkdl's
iteration time at each table size against its time at the smallest, the split of sparkdl's
iteration (compute, reduce, update, broadcast) and the first and final losses.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import TD_TIMEOUT_S, _kill_torchrun_after, spark_floor  # noqa: E402
from sparkdl.data.batch_plan import BatchPlan  # noqa: E402

USERS, DIM, BATCH, SAMPLES, PARTITIONS, SEED, LR = 100_000, 32, 2048, 65_536, 2, 0, 1e-3
ALLREDUCE = ["shuffle"]          # --allreduce


class TwoTower(nn.Module):
    def __init__(self, items: int) -> None:
        super().__init__()
        self.user = nn.Embedding(USERS, DIM, sparse=True)
        self.item = nn.Embedding(items, DIM, sparse=True)
        self.head = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.user(ids[:, 0]) * self.item(ids[:, 1])).squeeze(-1)


def model(items: int) -> TwoTower:
    torch.manual_seed(0)
    return TwoTower(items)


def optimizers(net: TwoTower) -> list[torch.optim.Optimizer]:
    return [torch.optim.SparseAdam([net.user.weight, net.item.weight], lr=LR),
            torch.optim.Adam(net.head.parameters(), lr=LR)]


def ratings(items: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Zipf-like ids (rank r drawn with weight 1 / (r + 10)), ratings from hidden factors."""
    rng = np.random.default_rng(seed)

    def zipf(n: int) -> np.ndarray:
        u = rng.random(SAMPLES)
        return np.minimum((np.exp(u * np.log(n / 10 + 1)) - 1) * 10, n - 1).astype(np.int64)

    users, item_ids = zipf(USERS), rng.permutation(items)[zipf(items)]
    score = np.sin(users * 0.37) * np.cos(item_ids * 0.11) * 2 + 3
    return (np.stack([users, item_ids], 1),
            (score + rng.normal(0, 0.3, SAMPLES)).astype(np.float32))


def plan() -> BatchPlan:
    return BatchPlan([SAMPLES // PARTITIONS] * PARTITIONS, BATCH, SEED, True)


def _step(net: nn.Module, opts: list[torch.optim.Optimizer], x: torch.Tensor,
          y: torch.Tensor) -> torch.Tensor:
    """One training step with every optimizer; the batch loss."""
    for o in opts:
        o.zero_grad()
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    for o in opts:
        o.step()
    return loss.detach()


def _single(items: int, steps: int, warmup: int, queue: Any) -> None:
    torch.set_num_threads(2)
    x, y = ratings(items)
    net = model(items)
    opts, p, times, losses = optimizers(net), plan(), [], []
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    for t in range(steps):
        t0 = time.perf_counter()
        idx = torch.from_numpy(p.global_indices(*p.epoch_and_step(t)))
        losses.append(float(_step(net, opts, xs[idx], ys[idx])))
        times.append(time.perf_counter() - t0)
    queue.put((BATCH / statistics.median(times[warmup:]), losses[0], losses[-1]))


def run_single(items: int, steps: int, warmup: int, **_: Any) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_single, args=(items, steps, warmup, queue))
    proc.start()
    try:
        rate, first, final = queue.get(timeout=3600)
    finally:
        proc.join()
    return {"samples_per_s": rate, "first": first, "final": final}


def _ddp(items: int, steps: int, warmup: int) -> dict[str, float]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = ratings(items)
    net = DistributedDataParallel(model(items))
    opts, p, times, losses = optimizers(net.module), plan(), [], []
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    for t in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        epoch, step = p.epoch_and_step(t)
        idx = torch.from_numpy(p.offsets[rank] + p.local_indices(epoch, step, rank))
        total = torch.tensor([float(_step(net, opts, xs[idx], ys[idx])) * len(idx)])
        dist.all_reduce(total)
        losses.append(float(total) / p.batch_size_at(step))
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return {"samples_per_s": BATCH / statistics.median(times[warmup:]), "first": losses[0],
            "final": losses[-1]}


def run_torch_distributor(items: int, steps: int, warmup: int, **_: Any) -> dict[str, float]:
    import threading

    from pyspark.ml.torch.distributor import TorchDistributor

    done = threading.Event()
    threading.Thread(target=_kill_torchrun_after, args=(TD_TIMEOUT_S, done), daemon=True).start()
    try:
        return TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                use_gpu=False).run(_ddp, items, steps, warmup)
    finally:
        done.set()


def run_sparkdl(items: int, steps: int, warmup: int, sc: Any = None) -> dict[str, float]:
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    x, y = ratings(items)
    net = model(items)
    opt = DistriOptimizer(net, sc.parallelize(list(zip(x, y)), PARTITIONS), nn.MSELoss(),
                          optimizers(net), batch_size=BATCH, end_trigger=MaxIteration(steps),
                          seed=SEED, progress_bar=False, allreduce=ALLREDUCE[0])
    opt.optimize()
    timed = opt.summary.iterations[warmup:]
    out = {"samples_per_s": BATCH / statistics.median(r.wall_s for r in timed),
           "first": opt.summary.iterations[0].loss, "final": opt.summary.iterations[-1].loss}
    for key in ("wall_s", "compute_s", "reduce_s", "update_s", "broadcast_s"):
        out[key] = statistics.median(getattr(r, key) for r in timed)
    return out


RUNNERS = {"single": run_single, "torchdistributor": run_torch_distributor,
           "sparkdl": run_sparkdl}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", nargs="+", type=int, default=[100_000, 1_000_000, 4_000_000])
    p.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS))
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--allreduce", default="shuffle", choices=["shuffle", "driver", "auto"],
                   help="sparkdl's AllReduce path")
    args = p.parse_args()
    ALLREDUCE[0] = args.allreduce
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sparkdl.spark_settings import spark_session

    # a 4M-row table's full copy (500 MiB) is stored in the driver's block manager
    spark = spark_session("sparkdl bench: recommender scale", args.master,
                          {"spark.ui.enabled": "false", "spark.driver.memory": "6g"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    results: dict[tuple[int, str], dict[str, float]] = {}
    for items in args.items:
        for runner in args.runners:
            t0 = time.perf_counter()
            try:
                res = RUNNERS[runner](items, args.iterations, args.warmup, sc=sc)
            except Exception as exc:      # a runner that fails is reported, not fatal
                print(f"{items:>9,} {runner:17s} FAILED: {str(exc).splitlines()[0][:200]}",
                      file=sys.stderr, flush=True)
                continue
            results[(items, runner)] = res
            print(f"{items:>9,} {runner:17s} {res['samples_per_s']:10,.0f} samples/s  loss "
                  f"{res['first']:.4f} -> {res['final']:.4f}  ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    report(args, results)
    two, _, one, jvm = spark_floor(sc, 4, repeats=30)
    td = [r["samples_per_s"] for (_, name), r in results.items() if name == "torchdistributor"]
    print(f"\nSpark's job floors in this session (empty jobs over {PARTITIONS} cached partitions, "
          f"medians of 30): JVM-only (count, no Python) {1000 * jvm:.1f} ms, one-stage PySpark "
          f"(mapPartitions, collect) {1000 * one:.1f} ms, two-stage PySpark (map, reduceByKey, "
          f"collect) {1000 * two:.1f} ms"
          + (f"; TorchDistributor's iteration {1000 * BATCH / statistics.median(td):.1f} ms, "
             f"so W4 >= 0.5x it allows {2000 * BATCH / statistics.median(td):.1f} ms an "
             "iteration" if td else ""))
    spark.stop()


def report(args: Any, results: dict[tuple[int, str], dict[str, float]]) -> None:
    base = results.get((args.items[0], "sparkdl"))
    print("| item rows | table MiB | single | TorchDistributor | sparkdl | sparkdl / TD | "
          "sparkdl iteration vs smallest | sparkdl compute / reduce / update / broadcast ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for items in args.items:
        row = {r: results.get((items, r)) for r in RUNNERS}
        rate = {r: (f"{v['samples_per_s']:,.0f}" if v else "-") for r, v in row.items()}
        s, td = row["sparkdl"], row["torchdistributor"]
        ratio = f"{s['samples_per_s'] / td['samples_per_s']:.2f}" if s and td else "-"
        growth = f"{s['wall_s'] / base['wall_s']:.2f}x" if s and base else "-"
        split = (" / ".join(f"{s[k] * 1000:.0f}" for k in
                            ("compute_s", "reduce_s", "update_s", "broadcast_s")) if s else "-")
        mib = (USERS + items) * DIM * 4 / 2**20
        print(f"| {items:,} | {mib:,.0f} | {rate['single']} | {rate['torchdistributor']} | "
              f"{rate['sparkdl']} | {ratio} | {growth} | {split} |")


if __name__ == "__main__":
    main()
