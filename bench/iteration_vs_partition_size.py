"""Per-iteration time against partition size, at the same global batch (issue: the engine).

    python bench/iteration_vs_partition_size.py [--sizes 10000 200000] [--iterations 40]

Trains the W1 model (MLP 784-256-10, SGD) on 2 partitions of synthetic MNIST-shaped data on
local[2], after a discarded warm-up run, for each partition size in turn, four rounds interleaved.
Prints, per size, the median iteration time and the median slowest-task compute time (after
warm-up), with ratios to the smallest size. Since every iteration reads only its batch from the
executor-held shards, both ratios should stay near 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


def make_rdd(sc, per_partition: int, partitions: int = 2):
    def generate(index, _):
        rng = np.random.default_rng(index)
        protos = np.random.default_rng(42).normal(size=(10, 784)).astype(np.float32)
        for _ in range(per_partition):
            label = int(rng.integers(10))
            yield protos[label] + rng.normal(size=784).astype(np.float32), label

    return sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(generate)


def run(sc, per_partition: int, iterations: int, warmup: int) -> float:
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    torch.manual_seed(42)
    net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = DistriOptimizer(net, make_rdd(sc, per_partition), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9),
                          batch_size=256, end_trigger=MaxIteration(iterations), seed=0)
    t0 = time.perf_counter()
    opt.optimize()
    walls = [r.wall_s for r in opt.summary.iterations[warmup:]]
    tasks = [r.compute_s for r in opt.summary.iterations[warmup:]]
    print(f"  {per_partition:>7} samples/partition: median iteration "
          f"{1000 * statistics.median(walls):7.1f} ms, slowest task {1000 * statistics.median(tasks):6.2f} ms"
          f"  (run incl. shard build {time.perf_counter() - t0:5.1f} s)", flush=True)
    return statistics.median(walls), statistics.median(tasks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 200_000])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.unix.domain.socket.enabled", "true")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[int, list[tuple[float, float]]] = {s: [] for s in args.sizes}
    print("warm-up run (discarded: Spark's JVM is slow for its first jobs)", flush=True)
    run(spark.sparkContext, args.sizes[0], 2 * args.iterations, args.warmup)
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}", flush=True)
        for size in args.sizes:
            results[size].append(run(spark.sparkContext, size, args.iterations, args.warmup))
    def med(size: int, k: int) -> float:
        return statistics.median(r[k] for r in results[size])

    print("\nsamples/partition | iteration (ms) | ratio | slowest task compute (ms) | ratio")
    for size in args.sizes:
        print(f"{size:>17} | {1000 * med(size, 0):14.1f} | {med(size, 0) / med(args.sizes[0], 0):5.3f}"
              f" | {1000 * med(size, 1):25.2f} | {med(size, 1) / med(args.sizes[0], 1):5.3f}")
    spark.stop()


if __name__ == "__main__":
    main()
