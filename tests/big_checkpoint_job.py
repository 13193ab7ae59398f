"""A model whose checkpoint is above 250 MB, trained in its own driver process with Spark's
default driver memory (1 GiB): ~22 M float32 parameters under Adam (weights plus two moments).

    python big_checkpoint_job.py OUT.pt ITERATIONS [CHECKPOINT_DIR]

Trains ``ITERATIONS`` iterations (resuming from CHECKPOINT_DIR when it holds a checkpoint,
writing one after every 2 iterations) and saves the final state_dict to OUT.pt.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

IN, OUT = 2400, 9000


def main() -> None:
    out, iterations = sys.argv[1], int(sys.argv[2])
    checkpoint_dir = sys.argv[3] if len(sys.argv) > 3 else None
    from conftest import spark_builder
    from models import make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration, SeveralIteration

    spark = spark_builder("local[2]").getOrCreate()     # spark.driver.memory: the default
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    assert sc.getConf().get("spark.driver.memory", "1g") == "1g"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, IN)).astype(np.float32)
    y = rng.integers(0, OUT, 24)
    torch.manual_seed(0)
    net = torch.nn.Linear(IN, OUT)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [14, 10]),
                          torch.nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-3),
                          batch_size=8, end_trigger=MaxIteration(iterations), seed=1,
                          progress_bar=False)
    if checkpoint_dir:
        opt.set_checkpoint(checkpoint_dir, SeveralIteration(2), keep_last=1)
    opt.optimize()
    torch.save(net.state_dict(), out)
    spark.stop()


if __name__ == "__main__":
    main()
