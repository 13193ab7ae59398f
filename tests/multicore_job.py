"""Three models trained with tasks of two cores each, in their own driver process.

    python multicore_job.py MASTER OUT_DIR [--fault executor --marker PATH] [--iterations N]

``local-cluster[2,2,1024]`` with ``spark.task.cpus=2``: two executors of two cores, one task at
a time on each, every task computing its share on two sub-replicas in threads (the automatic
choice for the CNN, asked for the others; the log says so). Saves ``mlp.pt``, ``cnn.pt`` and ``embedding.pt``. ``--fault executor``
SIGKILLs an executor JVM in the MLP's third task call. The test (test_task_aggregation.py)
compares them with single-process torch on the same union batches and with a clean run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = [48, 0, 26, 37, 19]
BATCH = 24
ITERATIONS = 10
SEED = 3


def models() -> dict[str, nn.Module]:
    """The three models, with their initial weights (the same on every call)."""
    torch.manual_seed(11)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 2),
                        nn.ReLU(), nn.Flatten(), nn.Linear(6 * 2 * 2, 3))
    embedding = nn.Sequential(nn.Embedding(40, 5), nn.Flatten(), nn.Linear(4 * 5, 3))
    return {"mlp": mlp, "cnn": cnn, "embedding": embedding}


def data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Each model's inputs and labels (3 classes), one row per sample."""
    rng = np.random.default_rng({"mlp": 1, "cnn": 2, "embedding": 3}[name])
    n = sum(SIZES)
    y = rng.integers(0, 3, n)
    if name == "mlp":
        x = (rng.normal(size=(n, 6)) + y[:, None]).astype(np.float32)
    elif name == "cnn":
        x = (rng.normal(size=(n, 1, 8, 8)) + y[:, None, None, None] * 0.5).astype(np.float32)
    else:
        x = (rng.integers(0, 13, (n, 4)) + 13 * y[:, None]).astype(np.int64)
    return x, y


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("master")
    p.add_argument("out_dir")
    p.add_argument("--fault", choices=["executor"])
    p.add_argument("--marker")
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    from conftest import spark_builder
    from models import FaultInjectingLoss, make_rdd

    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    spark = (spark_builder(args.master).config("spark.executor.memory", "768m")
             .config("spark.task.cpus", "2").getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    for name, model in models().items():
        x, y = data(name)
        criterion = (FaultInjectingLoss(args.fault, args.marker)
                     if args.fault and name == "mlp" else nn.CrossEntropyLoss())
        # the CNN by the automatic choice, the others (one replica by default) explicitly
        opt = DistriOptimizer(model, make_rdd(sc, list(zip(x, y)), SIZES), criterion,
                              optimizer(model), batch_size=BATCH,
                              end_trigger=MaxIteration(args.iterations), seed=SEED,
                              sub_replicas=None if name == "cnn" else 2)
        trained = opt.optimize()
        torch.save(trained.state_dict(), os.path.join(args.out_dir, f"{name}.pt"))
        print(f"{name}_iterations={len(opt.summary.iterations)}")
    print(f"executors={sc._jsc.sc().getExecutorMemoryStatus().size() - 1}")
    spark.stop()


if __name__ == "__main__":
    main()
