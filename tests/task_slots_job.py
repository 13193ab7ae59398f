"""Training partitions against task slots, in its own driver process on local-cluster.

    python task_slots_job.py MASTER

``local-cluster[2,2,1024]`` with ``spark.task.cpus=2`` (two task slots; four cores, Spark's
default parallelism): an NNClassifier fit with ``numTrainWorkers`` left at 0, then a
DistriOptimizer fit on an RDD of 8 partitions. Prints one JSON line: the task slots, and the
log lines of each fit that say its partitions ("training on ...") and its waves.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RDD_SIZES = [5, 6, 4, 7, 5, 6, 4, 3]


class Lines(logging.Handler):
    """The messages of the ``sparkdl`` logger, kept."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelname, record.getMessage()))

    def take(self) -> dict[str, list[str]]:
        out = {"described": [m for _, m in self.messages if m.startswith("training on ")],
               "waves": [f"{level} {m}" for level, m in self.messages if " waves " in m]}
        self.messages = []
        return out


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from conftest import spark_builder
    from df_helpers import mlp4
    from models import make_rdd
    from pyspark.ml.linalg import Vectors

    from sparkdl import DistriOptimizer, NNClassifier
    from sparkdl.task_slots import task_slots
    from sparkdl.triggers import MaxIteration

    lines = Lines()
    logging.getLogger("sparkdl").addHandler(lines)
    logging.getLogger("sparkdl").setLevel(logging.INFO)
    spark = (spark_builder(sys.argv[1]).config("spark.executor.memory", "768m")
             .config("spark.task.cpus", "2")
             .config("spark.default.parallelism", "4")   # Spark's own: the 4 cores
             .getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    result: dict[str, object] = {"slots": task_slots(spark),
                                 "default_parallelism": sc.defaultParallelism}

    rng = np.random.default_rng(4)
    x = rng.normal(size=(48, 4))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    df = spark.createDataFrame([(Vectors.dense(r.tolist()), float(t)) for r, t in zip(x, y)],
                               ["features", "label"]).repartition(4)
    NNClassifier(model=mlp4, criterion=torch.nn.CrossEntropyLoss(), batchSize=16, maxEpoch=1,
                 seed=1, progressBar=False).fit(df)
    result["estimator"] = lines.take()

    model = mlp4()
    records = [(r.astype(np.float32), int(t)) for r, t in zip(x[:sum(RDD_SIZES)], y)]
    rdd = make_rdd(sc, records, RDD_SIZES)
    DistriOptimizer(model, rdd, torch.nn.CrossEntropyLoss(),
                    torch.optim.SGD(model.parameters(), lr=0.1), batch_size=16,
                    end_trigger=MaxIteration(2), seed=1, progress_bar=False).optimize()
    result["engine"] = lines.take()
    result["rdd_partitions"] = rdd.getNumPartitions()
    print("RESULT " + json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main()
