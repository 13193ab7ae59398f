"""Where the one-stage driver AllReduce stops beating the two-stage shuffle, by gradient size.

    python bench/allreduce_crossover.py [--mib 0.25 1 4 16 64 128] [--iterations 16] [--rounds 2]

For MLPs 784-h-10 whose fp32 gradient is about each size in --mib, trains 2 partitions of
synthetic data (batch 64, so compute is small) with allreduce="driver" and "shuffle" in turn,
interleaved, on local[2], and prints the median iteration time of each and their ratio. The
driver receives (partitions x gradient bytes) per iteration on the driver path and the summed
gradient only on the shuffle path. The result sets sparkdl.transport.allreduce.DRIVER_ALLREDUCE_MAX_BYTES
(see docs/scaling.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def median_iteration(sc, hidden: int, allreduce: str, iterations: int, warmup: int) -> float:
    from sparkdl import DistriOptimizer
    from sparkdl.datasets import mlp
    from sparkdl.triggers import MaxIteration

    rng = np.random.default_rng(0)
    records = [(rng.normal(size=784).astype(np.float32), int(i % 10)) for i in range(2048)]
    torch.manual_seed(42)
    net = mlp([784, hidden, 10])
    opt = DistriOptimizer(net, sc.parallelize(records, 2), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.01), batch_size=64,
                          end_trigger=MaxIteration(warmup + iterations), allreduce=allreduce,
                          progress_bar=False)
    opt.optimize()
    return statistics.median(r.wall_s for r in opt.summary.iterations[warmup:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, nargs="+", default=[0.25, 1, 4, 16, 64, 128])
    p.add_argument("--iterations", type=int, default=16)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl bench: allreduce crossover", "local[2]",
                          {"spark.ui.enabled": "false"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    median_iteration(sc, 64, "driver", 10, 10)      # warm the JVM up
    times: dict[tuple[float, str], list[float]] = {}
    for _ in range(args.rounds):
        for mib in args.mib:
            hidden = max(1, int(mib * 2**20 / 4 / (784 + 1 + 10)))
            for path in ("driver", "shuffle"):
                times.setdefault((mib, path), []).append(
                    median_iteration(sc, hidden, path, args.iterations, args.warmup))
                print(f"{mib:g} MiB {path}: {1000 * times[(mib, path)][-1]:.1f} ms",
                      file=sys.stderr, flush=True)
    print("| gradient MiB | bytes to the driver (driver path) | driver ms | shuffle ms | "
          "driver / shuffle |")
    print("|---:|---:|---:|---:|---:|")
    for mib in args.mib:
        d = 1000 * statistics.median(times[(mib, "driver")])
        s = 1000 * statistics.median(times[(mib, "shuffle")])
        print(f"| {mib:g} | {2 * mib:g} MiB | {d:.1f} | {s:.1f} | {d / s:.2f} |")
    spark.stop()


if __name__ == "__main__":
    main()
