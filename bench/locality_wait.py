"""Iteration time with ``spark.locality.wait=0`` against Spark's default (3 s), side by side.

    python bench/locality_wait.py                      # W2, 8 partitions, 2 rounds
    python bench/locality_wait.py --partitions 2 --rounds 3

W2 (LeNet-5, global batch 1024, 8192 synthetic MNIST-shaped samples; bench/compare_runners.py)
on ``local-cluster[2,1,1024]``: two executor JVMs of one core each, so with more partitions than
two, tasks queue for slots. With ``spark.locality.wait=0`` a task runs on the first free slot,
wherever its shard is; sparkdl then builds that one shard where the task ran (a placement miss,
see sparkdl/runners/cached_rdd.py). With the default wait, tasks wait up to 3 s for the executor
that holds their shard.

Every run is its own driver process (the wait is a SparkContext setting); the two settings
alternate, round after round. Prints per setting: the median iteration time over the timed
iterations, the mean over all iterations including the first ones (where the misses happen),
the placement misses and rebuilt shards, and a digest of the final weights (equal digests:
bitwise the same training).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASTER = "local-cluster[2,1,1024]"


def child(wait: str | None, partitions: int, warmup: int, timed: int) -> None:
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import torch
    from pyspark.sql import SparkSession

    from compare_runners import LR, MOMENTUM, SEED, WORKLOADS, synthetic_data
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    builder = (SparkSession.builder.master(MASTER).appName("locality-wait-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.executor.memory", "1g"))
    if wait is not None:
        builder = builder.config("spark.locality.wait", wait)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    w = WORKLOADS["W2"]
    x, y = synthetic_data()
    net = w.model()
    opt = DistriOptimizer(net, spark.sparkContext.parallelize(list(zip(x, y)), partitions),
                          torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM),
                          batch_size=w.batch, end_trigger=MaxIteration(warmup + timed),
                          seed=SEED, progress_bar=False)
    opt.optimize()
    records = opt.summary.iterations
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in net.state_dict().values())).hexdigest()[:16]
    print(json.dumps({
        "median_s": statistics.median(r.wall_s for r in records[warmup:]),
        "mean_all_s": statistics.fmean(r.wall_s for r in records),
        "misses": opt.summary.placement_misses,
        "rebuilt": opt.summary.shards_rebuilt,
        "digest": digest}))
    spark.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timed", type=int, default=20)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(None if args.child == "default" else args.child, args.partitions, args.warmup,
              args.timed)
        return
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
               SPARK_LOCAL_IP="127.0.0.1")
    results: dict[str, list[dict]] = {"default": [], "0": []}
    for _ in range(args.rounds):
        for wait in results:
            out = subprocess.run([sys.executable, __file__, "--child", wait, "--partitions",
                                  str(args.partitions), "--warmup", str(args.warmup),
                                  "--timed", str(args.timed)],
                                 capture_output=True, text=True, env=env, check=True)
            results[wait].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(r["median_s"] for r in results["default"])
    print(f"W2 on {MASTER}, {args.partitions} partitions, {args.rounds} rounds, "
          f"{args.warmup} + {args.timed} iterations per run")
    print(f"{'spark.locality.wait':>20} {'iter s (median)':>16} {'ratio':>6} "
          f"{'mean s, all its':>16} {'misses':>7} {'rebuilt':>8}  weights")
    for wait, runs in results.items():
        med = statistics.median(r["median_s"] for r in runs)
        print(f"{'3s (default)' if wait == 'default' else wait:>20} {med:>16.3f} "
              f"{med / base:>6.2f} {statistics.fmean(r['mean_all_s'] for r in runs):>16.3f} "
              f"{'/'.join(str(r['misses']) for r in runs):>7} "
              f"{'/'.join(str(r['rebuilt']) for r in runs):>8}  "
              f"{' '.join(sorted({r['digest'] for r in runs}))}")


if __name__ == "__main__":
    main()
