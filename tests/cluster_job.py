"""A small training run in its own driver process: ``python cluster_job.py MASTER OUT.pt``.

Used by tests that need a master other than the session's local[2] (only one SparkContext can
live in a process). Prints the number of executors and saves the trained state_dict.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import SmallNet, classification_data, make_rdd  # noqa: E402

SIZES = [40, 0, 25, 35]
BATCH = 16
ITERATIONS = 6
SEED = 5


def train(sc):
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    x, y = classification_data(sum(SIZES), seed=1)
    torch.manual_seed(7)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9),
                          batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED)
    return opt.optimize()


def main() -> None:
    master, out = sys.argv[1], sys.argv[2]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from conftest import spark_builder

    spark = (spark_builder(master).config("spark.executor.memory", "768m")
             .config("spark.task.maxFailures", "4").getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    trained = train(sc)
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
    torch.save(trained.state_dict(), out)
    print(f"executors={executors}")
    spark.stop()


if __name__ == "__main__":
    main()
