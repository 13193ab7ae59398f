"""Fit the per-iteration cost model of docs/scaling.md on this machine and predict larger clusters.

    python bench/scaling_model.py [--master local[2]] [--bandwidth-gbit 10]
    python bench/scaling_model.py --master "local-cluster[4,1,1024]" --partitions 4

Measures, in one Spark session: an empty two-stage PySpark job on 2 tasks (the fixed cost of an
iteration's job, whose tasks run in parallel), JVM-only jobs on 2 and 64 partitions (an upper
bound on the driver's serial cost per task: scheduling, serialising and tracking a task), and
sparkdl's iteration on W2 (LeNet-5, batch 1024) and W3 (MLP 784-4096-4096-10, batch 128) on 2
partitions (``--partitions``: as many; on ``local-cluster[N,1,...]`` one per executor):
per-sample compute of one task, and, from W3, the per-byte cost of moving a gradient through
Python and the JVM. Then predicts iteration time, throughput and scaling efficiency at 8,
32 and 128 executors (one task each, per-task batch as on 2 workers: weak scaling) for an
assumed network bandwidth, on both AllReduce paths, and the 16 -> 96 efficiency to compare with
BigDL's published ~88%.

Model, per iteration with N tasks, gradient S bytes, b samples per task:
  shuffle: T(N) = c*b + j_s + d*N + 3*q*S + 3*S/BW
  driver:  T(N) = c*b + j_d + d*N + N*q*S + N*S/BW
  c*b       compute of one task (all tasks in parallel)
  j_s, j_d  the job's fixed cost (launch, stage barriers, collect) with two stages or one
  d*N       the driver's serial cost per task (scheduling, task results)
  q*S       one pass of S bytes through Python, the JVM and back (serialising, copying);
            the shuffle makes three that run in parallel across executors and reducers (map
            output, reducer input, sums to the driver), the driver path N at the driver
  3*S/BW    wire: reduce-scatter (each executor sends and receives ~S), sums into the driver
            (S), torrent broadcast (each executor fetches ~S); the driver path takes N*S in
Fitted: c from each workload's slowest task; j_s and j_d from W2 (tiny gradient) on each path;
q from W3 on the shuffle; d from JVM-only jobs on 2 and 64 partitions (an upper bound: on 2
cores it includes the executors' own per-task work).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import WORKLOADS, run_sparkdl, synthetic_data  # noqa: E402


def _median_time(fn, repeats: int = 20) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def jvm_job_seconds(spark, tasks: int) -> float:
    df = spark.range(0, tasks * 10, 1, tasks)
    return _median_time(df.count)


def predict(path: str, c: float, b: int, s: float, fit: dict[str, float], bw: float,
            n: int) -> float:
    if path == "driver":
        return c * b + fit["j_d"] + fit["d"] * n + n * fit["q"] * s + n * s / bw
    return c * b + fit["j_s"] + fit["d"] * n + 3 * fit["q"] * s + 3 * s / bw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--bandwidth-gbit", type=float, default=10.0)
    ap.add_argument("--executor-cores", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=2,
                    help="the fitted runs' tasks (the workloads' global batch split in as many)")
    ap.add_argument("--sub-replica-efficiency", type=float, default=0.9,
                    help="parallel efficiency of a task's sub-replicas (bench/task_aggregation.py)")
    args = ap.parse_args()
    import compare_runners

    compare_runners.PARTITIONS = parts = args.partitions
    from sparkdl.transport.allreduce import choose_allreduce
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl bench: scaling model", args.master,
                          {"spark.ui.enabled": "false"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    jv2, jv64 = jvm_job_seconds(spark, 2), jvm_job_seconds(spark, 64)
    x, y = synthetic_data()
    w2, w3 = WORKLOADS["W2"], WORKLOADS["W3"]
    runs = {("W2", "driver"): run_sparkdl(w2, x, y, sc=sc, allreduce="driver").split,
            ("W2", "shuffle"): run_sparkdl(w2, x, y, sc=sc, allreduce="shuffle").split,
            ("W3", "shuffle"): run_sparkdl(w3, x, y, sc=sc, allreduce="shuffle").split}
    sizes = {name: WORKLOADS[name].gradient_bytes() for name in ("W2", "W3")}
    per_sample = {name: runs[(name, "shuffle")]["compute_s"] / (WORKLOADS[name].batch // parts)
                  for name in ("W2", "W3")}
    fit = {"d": max(0.0, (jv64 - jv2) / 62)}
    fit["j_s"] = runs[("W2", "shuffle")]["wall_s"] - runs[("W2", "shuffle")]["compute_s"]
    fit["q"] = max(0.0, (runs[("W3", "shuffle")]["wall_s"] - runs[("W3", "shuffle")]["compute_s"]
                         - fit["j_s"]) / (3 * sizes["W3"]))
    fit["j_d"] = (runs[("W2", "driver")]["wall_s"] - runs[("W2", "driver")]["compute_s"]
                  - 2 * fit["q"] * sizes["W2"])
    bw = args.bandwidth_gbit * 1e9 / 8
    print(f"fitted on {args.master}, {parts} tasks: j_s = {1e3 * fit['j_s']:.1f} ms (two "
          "stages), j_d = "
          f"{1e3 * fit['j_d']:.1f} ms (one stage), q = {1e9 * fit['q']:.2f} ns/byte per pass, "
          f"d <= {1e3 * fit['d']:.2f} ms/task (JVM-only job {1e3 * jv2:.1f} ms on 2 partitions, "
          f"{1e3 * jv64:.1f} ms on 64); network {args.bandwidth_gbit:g} Gbit/s\n")
    for (name, path), split in runs.items():
        b = WORKLOADS[name].batch // parts
        model = predict(path, per_sample[name], b, sizes[name], fit, float("inf"), parts)
        print(f"{name} {path}: gradient {sizes[name] / 2**20:.2f} MiB, {b} samples/task, "
              f"compute {1e3 * per_sample[name]:.3f} ms/sample; measured iteration "
              f"{1e3 * split['wall_s']:.1f} ms, model {1e3 * model:.1f} ms")
    rows = []
    for name in ("W2", "W3"):
        b, s = WORKLOADS[name].batch // 2, sizes[name]
        for n in (8, 16, 32, 96, 128):
            for path in ("shuffle", "driver"):
                t = predict(path, per_sample[name], b, s, fit, bw, n)
                rows.append((name, n, path, t, n * b / t, per_sample[name] * b / t,
                             path == choose_allreduce(s, n)))
    print("\n| workload | executors | global batch | path | iteration ms | samples/s | "
          "compute / iteration |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, n, path, t, thr, eff, auto in rows:
        if n in (8, 32, 128):
            mark = " (auto)" if auto else ""
            print(f"| {name} | {n} | {n * (WORKLOADS[name].batch // 2):,} | {path}{mark} | "
                  f"{1e3 * t:.0f} | {thr:,.0f} | {eff:.0%} |")
    print(f"\nExecutors of {args.executor_cores} cores (the per-core batch as on 2 workers): one "
          "task per core, or one task per executor on sub-replicas (executor-level "
          f"aggregation, compute at {args.sub_replica_efficiency:.0%} parallel efficiency):\n")
    print("| workload | executors | global batch | tasks | path | iteration ms | samples/s | "
          "driver's share (d*N + driver-side bytes) |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    k = args.executor_cores
    for name in ("W2", "W3"):
        b, s = WORKLOADS[name].batch // 2, sizes[name]
        for executors in (8, 32, 128):
            for tasks, compute in ((executors * k, per_sample[name] * b),
                                   (executors, per_sample[name] * b
                                    / args.sub_replica_efficiency)):
                path = choose_allreduce(s, tasks)
                t = predict(path, compute / b, b, s, fit, bw, tasks)
                driver = fit["d"] * tasks + (tasks if path == "driver" else 1) * (
                    fit["q"] * s + s / bw)
                print(f"| {name} | {executors} | {executors * k * b:,} | {tasks} | {path} | "
                      f"{1e3 * t:.0f} | {executors * k * b / t:,.0f} | {driver / t:.0%} |")
    print()
    for name in ("W2", "W3"):
        for path in ("shuffle", "driver"):
            thr = {n: v for w, n, pa, _, v, _, _ in rows if w == name and pa == path}
            print(f"{name} {path}: throughput 96 / 16 executors = {thr[96] / thr[16]:.2f} "
                  f"(linear 6.00): efficiency 16 -> 96 = {thr[96] / thr[16] / 6:.0%}")
    spark.stop()


if __name__ == "__main__":
    main()
