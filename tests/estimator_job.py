"""An estimator fit in its own driver process (so a test can kill it), with checkpointDir.

    python estimator_job.py MASTER OUT.pt CHECKPOINT_DIR [--epochs N]

Saves the fitted model's state_dict to OUT.pt. The data and model are those of
:func:`fit` below, which the test also calls in its own session for the uninterrupted fit.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def frame(spark):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 3)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.5]) + 0.1 * rng.normal(size=240)).astype(np.float32)
    return spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(x, y)],
                                 ["features", "y"]).coalesce(2)


def model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1),
                               torch.nn.Flatten(0))


def fit(spark, epochs, checkpoint_dir=""):
    from sparkdl import NNEstimator

    est = NNEstimator(model=model, criterion=torch.nn.MSELoss(), labelCol="y", batchSize=48,
                      maxEpoch=epochs, seed=5, numTrainWorkers=2, optimizer="adam",
                      learningRate=0.01, checkpointDir=checkpoint_dir, progressBar=False)
    return est.fit(frame(spark))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("master")
    p.add_argument("out")
    p.add_argument("checkpoint_dir")
    p.add_argument("--epochs", type=int, default=40)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from conftest import spark_builder

    spark = spark_builder(args.master).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    fitted = fit(spark, args.epochs, args.checkpoint_dir)
    torch.save(fitted.module.state_dict(), args.out)
    spark.stop()


if __name__ == "__main__":
    main()
