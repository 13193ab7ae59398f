"""A pass of three fits in its own driver process, for the tests that kill an executor or the
driver mid-pass (tests/test_fit_set_faults.py).

    python fit_set_job.py MASTER OUT.pt [--fault executor --marker PATH] [--checkpoint DIR]
                          [--strategy hop]

Trains :func:`fits` (SmallNet under Adam at two learning rates and one with another batch size,
over cluster_job's data) as one :class:`sparkdl.FitSet` and saves their state_dicts, in order.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_job import SEED, SIZES  # noqa: E402
from models import FaultInjectingLoss, SmallNet, classification_data, make_rdd  # noqa: E402

SETTINGS = [(0.01, 16, 8), (0.003, 16, 8), (0.01, 24, 10)]   # lr, batch size, iterations


def fits(sc, criterion=None, checkpoint=None):
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration, SeveralIteration

    x, y = classification_data(sum(SIZES), seed=1)
    rdd = make_rdd(sc, list(zip(x, y)), SIZES)
    out = []
    for lr, batch, iterations in SETTINGS:
        torch.manual_seed(7)
        net = SmallNet()
        optimizer = torch.optim.Adam(net.parameters(), lr=lr)
        opt = DistriOptimizer(net, rdd, criterion or torch.nn.CrossEntropyLoss(), optimizer,
                              batch_size=batch, end_trigger=MaxIteration(iterations), seed=SEED,
                              progress_bar=False)
        if checkpoint:
            opt.set_checkpoint(checkpoint, SeveralIteration(2), keep_last=2, by_fit=True)
        out.append(opt)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("master")
    p.add_argument("out")
    p.add_argument("--fault", choices=["executor"])
    p.add_argument("--marker")
    p.add_argument("--checkpoint")
    p.add_argument("--strategy", default="together")
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    from conftest import spark_builder
    from sparkdl import FitSet

    spark = spark_builder(args.master).config("spark.executor.memory", "768m").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # a hop task's criterion is a fresh copy per model and sub-epoch (at most 3 batches here)
    at_call = 2 if args.strategy == "hop" else 4
    criterion = FaultInjectingLoss(args.fault, args.marker, at_call) if args.fault else None
    trained = fits(spark.sparkContext, criterion, args.checkpoint)
    fit_set = FitSet(trained, strategy=args.strategy)
    fit_set.run()
    print(f"passes={fit_set.passes} jobs={fit_set.jobs}")
    print("iterations=" + ",".join(str(f.iteration) for f in trained))
    torch.save([f.model.state_dict() for f in trained], args.out)
    spark.stop()


if __name__ == "__main__":
    main()
