"""``transform`` rows/s against plain torch on the same batches in one process (DataFrame issue).

    python bench/transform_throughput.py [--rows 200000] [--rounds 3]

Fits an NNClassifier (MLP 784-256-10) briefly on local[2], then times, interleaved per round:
(a) ``model.transform(df)`` written to Spark's ``noop`` sink (all output columns computed), and
(b) the same model called by plain torch in this process (2 threads) on the same rows in batches
of ``inferenceBatchSize``. Prints rows/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from sparkdl import NNClassifier

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.unix.domain.socket.enabled", "true")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=args.rows)
    df = spark.createDataFrame([(row.tolist(), int(lab)) for row, lab in zip(x[:4096], y[:4096])],
                               ["features", "label"])
    big = spark.range(args.rows, numPartitions=2).selectExpr(
        "transform(sequence(1, 784), i -> cast(sin(id * 784 + i) as float)) as features")
    big = big.cache()
    big.count()
    clf = NNClassifier(model=lambda: torch.nn.Sequential(torch.nn.Linear(784, 256),
                                                         torch.nn.ReLU(), torch.nn.Linear(256, 10)),
                       criterion=torch.nn.CrossEntropyLoss(), batchSize=256, maxEpoch=1)
    model = clf.fit(df)
    net = model.module.eval()
    batch = model.getInferenceBatchSize()
    spark_rates, torch_rates = [], []
    for r in range(args.rounds + 1):
        t0 = time.perf_counter()
        model.transform(big).write.format("noop").mode("overwrite").save()
        spark_rate = args.rows / (time.perf_counter() - t0)
        torch.set_num_threads(2)
        t0 = time.perf_counter()
        with torch.no_grad():
            for lo in range(0, args.rows, batch):
                out = net(torch.from_numpy(x[lo:lo + batch]))
                torch.softmax(out, dim=1).argmax(dim=1)
        torch_rate = args.rows / (time.perf_counter() - t0)
        if r:  # round 0 warms up
            spark_rates.append(spark_rate)
            torch_rates.append(torch_rate)
        print(f"round {r}: transform {spark_rate:10.0f} rows/s, plain torch {torch_rate:10.0f} "
              f"rows/s{'' if r else '  (warm-up)'}", flush=True)
    s, t = statistics.median(spark_rates), statistics.median(torch_rates)
    print(f"\nmedian transform {s:.0f} rows/s | plain torch {t:.0f} rows/s | ratio {s / t:.3f}")
    spark.stop()


if __name__ == "__main__":
    main()
