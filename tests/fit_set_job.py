"""Passes of three fits in their own driver process, for the tests that kill an executor or the
driver mid-pass (tests/test_fit_set_faults.py).

    python fit_set_job.py MASTER OUT_DIR [--fault executor] [--checkpoint DIR]
                          [--strategy together hop ...]

Trains :func:`fits` (SmallNet under Adam at two learning rates and one with another batch size,
over cluster_job's data) as one :class:`sparkdl.FitSet` per strategy, one strategy after the
other in the same driver, and saves each strategy's state_dicts, in order, to
``OUT_DIR/STRATEGY.pt``. Each strategy has its own fits, its own fault (``--fault executor``
kills an executor once, claiming ``OUT_DIR/STRATEGY.marker``) and its own checkpoint directory
(``DIR/STRATEGY``); what the driver prints and logs while it trains a strategy is its section of
stdout and of stderr, delimited as cluster_scenarios.py's scenarios are (read one back with
:func:`cluster_scenarios.section`; a strategy that raises ends the process, unended).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_job import SEED, SIZES, local_cluster_executors, wait_for_executors  # noqa: E402
from cluster_scenarios import BEGIN, END, mark  # noqa: E402
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
    p.add_argument("out_dir")
    p.add_argument("--fault", choices=["executor"])
    p.add_argument("--checkpoint")
    p.add_argument("--strategy", nargs="+", default=["together"], choices=["together", "hop"])
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    from conftest import spark_builder
    from sparkdl import FitSet

    spark = spark_builder(args.master).config("spark.executor.memory", "768m").getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    os.makedirs(args.out_dir, exist_ok=True)
    for k, strategy in enumerate(args.strategy):
        if k and args.fault == "executor":
            # the worker relaunches the killed executor: the next strategy starts on a whole
            # cluster, as the first did
            wait_for_executors(sc, local_cluster_executors(args.master))
        mark(BEGIN.format(name=strategy))
        # a hop task's criterion is a fresh copy per model and sub-epoch (at most 3 batches)
        at_call = 2 if strategy == "hop" else 4
        marker = os.path.join(args.out_dir, f"{strategy}.marker")
        criterion = FaultInjectingLoss(args.fault, marker, at_call) if args.fault else None
        checkpoint = os.path.join(args.checkpoint, strategy) if args.checkpoint else None
        trained = fits(sc, criterion, checkpoint)
        fit_set = FitSet(trained, strategy=strategy)
        fit_set.run()
        print(f"passes={fit_set.passes} jobs={fit_set.jobs}")
        print("iterations=" + ",".join(str(f.iteration) for f in trained))
        torch.save([f.model.state_dict() for f in trained],
                   os.path.join(args.out_dir, f"{strategy}.pt"))
        mark(END.format(name=strategy, status="ok"))
    spark.stop()


if __name__ == "__main__":
    main()
