"""What MLflow logging costs a training run: fits with and without ``set_mlflow``, interleaved.

    python bench/mlflow_overhead.py                   # 3 rounds of 80 iterations each way
    python bench/mlflow_overhead.py --rounds 5 --iterations 150

Workload W1 of shared/docs/benchmarks.md (MLP 784-256-10, batch 256, 8192 synthetic samples in
2 partitions, SGD) on ``local[2]``: the shortest iteration of the reference workloads, so the
largest relative cost. The logging runs go to a real local tracking store (sqlite in a
temporary directory), a new run per fit, with the default flush interval.

Prints per round the median iteration time with and without logging and their ratio; the time
the training thread spends handing one iteration's values to the tracker (many calls timed);
and the time the background thread spent in ``MlflowClient.log_batch`` per fit, against the
fit's training time (on a 2-core machine that thread competes with training for the GIL and a
core).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sparkdl import DistriOptimizer  # noqa: E402
from sparkdl.datasets import mlp  # noqa: E402
from sparkdl.engine.fit.reports.mlflow_tracking import MlflowSetup, MlflowTracker  # noqa: E402
from sparkdl.engine.fit.reports.summary import IterationRecord  # noqa: E402
from sparkdl.triggers import MaxIteration  # noqa: E402

SAMPLES, PARTITIONS, BATCH, WARMUP = 8192, 2, 256, 5


def fit(rdd, iterations: int, logging_on: bool) -> tuple[float, float]:
    """Median iteration seconds (after warm-up) and the loop's total seconds."""
    torch.manual_seed(42)
    net = mlp((784, 256, 10))
    opt = DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9),
                          batch_size=BATCH, end_trigger=MaxIteration(iterations),
                          progress_bar=False)
    if logging_on:
        opt.set_mlflow(run_name="bench")
    opt.optimize()
    walls = [r.wall_s for r in opt.summary.iterations[WARMUP:]]
    return statistics.median(walls), sum(r.wall_s for r in opt.summary.iterations)


def handoff_seconds(calls: int = 100_000) -> float:
    """Seconds the training thread spends per ``tracker.iteration(record)``."""
    tracker = MlflowTracker(MlflowSetup(), {}, "sqlite:///unused.db", None)   # never started
    record = IterationRecord(1, 0, BATCH, 0.5, 0.01, 9000.0, 0.03, 0.01, 0.0, 0.001, 0.001, 0.0)
    start = time.perf_counter()
    for i in range(calls):
        record.iteration = i
        tracker.iteration(record)
        if len(tracker._pending) > 30_000:     # what the logging thread would take away
            tracker._pending.clear()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=80)
    args = parser.parse_args()

    import mlflow
    from mlflow import MlflowClient
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    spark = (SparkSession.builder.master("local[2]").appName("mlflow-overhead")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    store = tempfile.mkdtemp(prefix="sparkdl-mlflow-bench-")
    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    mlflow.set_experiment(experiment_id=mlflow.create_experiment(
        "bench", artifact_location=f"{store}/artifacts"))

    sending = [0.0]
    original = MlflowClient.log_batch

    def timed_log_batch(self, *a, **k):      # the background thread's time in the store
        start = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            sending[0] += time.perf_counter() - start

    MlflowClient.log_batch = timed_log_batch

    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 784), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES)
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), PARTITIONS)
    fit(rdd, WARMUP + 2, True)              # JVM, workers, the store's tables
    print(f"W1 on local[2], {args.iterations} iterations per fit, median iteration after "
          f"{WARMUP} warm-up iterations")
    print("| round | without ms | with ms | with / without | log_batch s per fit | "
          "share of the fit |")
    print("|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for round_ in range(1, args.rounds + 1):
        off, _ = fit(rdd, args.iterations, False)
        sending[0] = 0.0
        on, total = fit(rdd, args.iterations, True)
        ratios.append(on / off)
        print(f"| {round_} | {off * 1e3:.1f} | {on * 1e3:.1f} | {on / off:.3f} | "
              f"{sending[0]:.3f} | {sending[0] / total:.2%} |")
    handoff = handoff_seconds()
    print(f"median ratio with / without: {statistics.median(ratios):.3f}")
    print(f"training thread per iteration: {handoff * 1e6:.2f} us "
          f"({handoff / off:.4%} of a {off * 1e3:.1f} ms iteration)")
    spark.stop()


if __name__ == "__main__":
    main()
