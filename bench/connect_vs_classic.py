"""Per-iteration time of the Spark Connect runner against the classic one, W1 and W2, one run.

    python bench/connect_vs_classic.py                  # W1 and W2, 5 warm-up + 30 timed
    python bench/connect_vs_classic.py --timed 10

Both sides train the same model on the same data through the estimators' data path
(``frame_blocks`` over a Parquet file of 8192 synthetic MNIST-shaped samples in 2 partitions, SGD
lr 0.01 momentum 0.9, the same seed): the classic side on a local[2] session in this process
(RDD jobs, broadcasts), the Connect side in a subprocess with a local[2] Connect server
(DataFrame jobs, weights in the closure). W1: MLP 784-256-10 at batch 256; W2: LeNet-5 at
batch 1024 (../shared/docs/benchmarks.md). Prints the median per-iteration wall time of each
and the ratio, and checks that both ended with bitwise the same weights. The sides run one after
the other on the same machine: only their ratio is meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WORKLOADS = {"W1": ([784, 256, 10], 256), "W2": (None, 1024)}
SAMPLES, PARTITIONS = 8192, 2


def _model(name):
    from sparkdl.datasets import lenet5, mlp

    torch.manual_seed(42)
    sizes, _ = WORKLOADS[name]
    return mlp(sizes) if sizes else lenet5()


def _write_data(spark, path):
    from sparkdl.data.dataframe_arrays import arrays_to_dataframe

    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 784), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES)
    arrays_to_dataframe(spark, x, y).coalesce(1).write.mode("overwrite").parquet(path)


def run_side(spark, data, connect, warmup, timed):
    """{workload: (median iteration seconds, weights digest)} on ``spark``."""
    from sparkdl import DistriOptimizer
    from sparkdl.data.dataframe_arrays import feature_sources, frame_blocks
    from sparkdl.triggers import MaxIteration

    out = {}
    for name, (sizes, batch) in WORKLOADS.items():
        df = spark.read.parquet(data)
        shape = [] if sizes else [1, 28, 28]
        blocks = frame_blocks(df, feature_sources(df.schema, "features", []), "label", True,
                              shape, None, PARTITIONS)
        net = _model(name)
        opt = DistriOptimizer(net, blocks if connect else blocks.to_rdd(),
                              torch.nn.CrossEntropyLoss(),
                              torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9),
                              batch_size=batch, end_trigger=MaxIteration(warmup + timed),
                              seed=0, progress_bar=False)
        opt.optimize()
        walls = [r.wall_s for r in opt.summary.iterations[warmup:]]
        digest = float(sum(p.detach().double().sum() for p in net.parameters()))
        out[name] = (statistics.median(walls), repr(digest))
    return out


def _connect_main(data, warmup, timed, result_path):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.remote("local[2]")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    with open(result_path, "w") as f:
        json.dump(run_side(spark, data, True, warmup, timed), f)
    spark.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timed", type=int, default=30)
    parser.add_argument("--connect-side", nargs=2, metavar=("DATA", "RESULT"))
    args = parser.parse_args()
    if args.connect_side:
        _connect_main(args.connect_side[0], args.warmup, args.timed, args.connect_side[1])
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                               if p)
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="sparkdl-connect-bench-")
    data, result = os.path.join(tmp, "data"), os.path.join(tmp, "connect.json")
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    _write_data(spark, data)
    classic = run_side(spark, data, False, args.warmup, args.timed)
    spark.stop()
    subprocess.run([sys.executable, __file__, "--warmup", str(args.warmup), "--timed",
                    str(args.timed), "--connect-side", data, result], check=True)
    with open(result) as f:
        connect = json.load(f)
    print(f"{'workload':8} {'classic s/iter':>15} {'connect s/iter':>15} {'connect/classic':>16}"
          f"  same weights")
    for name in WORKLOADS:
        c, k = classic[name], connect[name]
        print(f"{name:8} {c[0]:15.3f} {k[0]:15.3f} {k[0] / c[0]:16.2f}x  {c[1] == k[1]}")


if __name__ == "__main__":
    main()
