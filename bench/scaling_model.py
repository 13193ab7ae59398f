"""Fit the per-iteration cost model of docs/scaling.md on this machine and predict larger clusters.

    python bench/scaling_model.py [--master local[2]] [--bandwidth-gbit 10]

Measures, in one Spark session: the empty two-stage PySpark job with 2 and 16 tasks (fixed
and per-task scheduling cost), and sparkdl's iteration split on W2 (LeNet-5, batch 1024) and W3
(MLP 784-4096-4096-10, batch 128) on 2 partitions: per-sample compute of one task, and the
per-byte cost sparkdl pays to move a gradient through Python and the JVM (iteration minus
compute, minus the job floor, divided by the gradient bytes). Then predicts iteration time,
throughput and scaling efficiency at 8, 32 and 128 executors (one task each, per-task batch as
on 2 workers: weak scaling) for an assumed network bandwidth, and the 16 -> 96 efficiency to
compare with BigDL's published ~88%.

Model, per iteration with N tasks, gradient S bytes, b samples per task:
  T(N) = c * b                      compute of the slowest task
       + j0 + j1 * N                Spark job: fixed cost + driver-side cost per task
       + p * S                      serialisation and copies (driver and executors in parallel)
       + 4 * S / BW                 wire: reduce-scatter (S out + S in per executor, overlapped
                                    = S), sums to the driver (S), broadcast (S up, pieces shared)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from operator import add

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import WORKLOADS, run_sparkdl, synthetic_data  # noqa: E402


def job_seconds(sc, tasks: int, repeats: int = 20) -> float:
    rdd = sc.parallelize(range(tasks), tasks)
    for _ in range(5):
        rdd.map(lambda v: (v, 1)).reduceByKey(add, tasks).collect()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rdd.map(lambda v: (v, 1)).reduceByKey(add, tasks).collect()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def predict(c: float, b: int, s: float, j0: float, j1: float, p: float, bw: float,
            n: int) -> float:
    return c * b + j0 + j1 * n + p * s + 4 * s / bw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--bandwidth-gbit", type=float, default=10.0)
    args = ap.parse_args()
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl bench: scaling model", args.master,
                          {"spark.ui.enabled": "false"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    j2, j16 = job_seconds(sc, 2), job_seconds(sc, 16)
    cores = sc.defaultParallelism
    # 16 tasks on `cores` cores: the extra tasks queue, so per-task cost = extra / (14 / cores)
    j1 = max(0.0, (j16 - j2) / ((16 - 2) / cores))
    j0 = j2 - 2 * j1
    x, y = synthetic_data()
    bw = args.bandwidth_gbit * 1e9 / 8
    print(f"fitted on {args.master}: two-stage job {1000 * j2:.1f} ms with 2 tasks, "
          f"{1000 * j16:.1f} ms with 16 -> j0 = {1000 * j0:.1f} ms, j1 = {1000 * j1:.2f} ms/task;"
          f" network {args.bandwidth_gbit:g} Gbit/s\n")
    rows = []
    for name in ("W2", "W3"):
        w = WORKLOADS[name]
        res = run_sparkdl(w, x, y, sc=sc, allreduce="shuffle")
        s = 4 * sum(t.numel() for t in w.model().parameters())
        b = w.batch // 2
        c = res.split["compute_s"] / b
        p = max(0.0, (res.split["wall_s"] - res.split["compute_s"] - j2) / s)
        measured = res.split["wall_s"]
        print(f"{name}: gradient {s / 2**20:.2f} MiB, {b} samples/task; compute "
              f"{1e3 * c:.3f} ms/sample; measured iteration {1e3 * measured:.1f} ms; per-byte "
              f"cost p = {1e9 * p:.2f} ns/byte")
        t1 = c * w.batch               # one process doing the whole global batch, no Spark
        for n in (2, 8, 16, 32, 96, 128):
            t = predict(c, b, s, j0, j1, p, bw, n)
            rows.append((name, n, t, n * b / t, (c * b) / t, t1))
    print("\n| workload | executors | global batch | iteration ms | samples/s | efficiency "
          "(compute / iteration) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, t, thr, eff, _ in rows:
        if n in (8, 32, 128):
            b = WORKLOADS[name].batch // 2
            print(f"| {name} | {n} | {n * b:,} | {1e3 * t:.0f} | {thr:,.0f} | {eff:.0%} |")
    print()
    for name in ("W2", "W3"):
        thr = {n: v for w, n, _, v, _, _ in rows if w == name}
        print(f"{name}: throughput 96 executors / 16 executors = {thr[96] / thr[16]:.2f} "
              f"(linear: 6.00): scaling efficiency 16 -> 96 = {thr[96] / thr[16] / 6:.0%}")
    spark.stop()


if __name__ == "__main__":
    main()
