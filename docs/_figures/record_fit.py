"""Record a real small fit for the site's figures: its per-iteration summary, its validations and
the progress bar as the terminal shows it, written to ``docs/_figures/fit_record.json``.

LeNet-5 on 12,000 Fashion-MNIST images, 3 epochs of batch 128 on ``local[2]``, Adam, validated
on the 10,000 test images after every epoch, the gradient summed by the shuffle's
block-sharded AllReduce (the path drawn in the architecture figure). ``make_figures.py`` draws the curves, the
iteration timeline and the progress bar from the file. Run from the repository root::

    python docs/_figures/record_fit.py && python docs/_figures/make_figures.py
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys

import torch

from sparkdl import DistriOptimizer, Loss, Top1Accuracy
from sparkdl.datasets import lenet5, load_fashion_mnist
from sparkdl.spark_settings import spark_session
from sparkdl.triggers import EveryEpoch, MaxEpoch

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_SAMPLES, EPOCHS, BATCH = 12000, 3, 128


def terminal_lines(captured: str) -> list[str]:
    """What a terminal shows after the bar's carriage returns and erase-line codes: the last
    state of every line."""
    lines = []
    for line in captured.replace("\x1b[K", "").split("\n"):
        if line:
            lines.append(line.rsplit("\r", 1)[-1])
    return lines


def main() -> None:
    spark = spark_session("sparkdl figures", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        sc = spark.sparkContext
        train_x, train_y, test_x, test_y = load_fashion_mnist(standardize=True)
        train = sc.parallelize(list(zip(train_x[:TRAIN_SAMPLES], train_y[:TRAIN_SAMPLES])), 2)
        test = sc.parallelize(list(zip(test_x, test_y)), 2)
        torch.manual_seed(0)
        net = lenet5()
        opt = DistriOptimizer(net, train, torch.nn.CrossEntropyLoss(),
                              torch.optim.Adam(net.parameters(), lr=0.003), batch_size=BATCH,
                              end_trigger=MaxEpoch(EPOCHS), seed=0, progress_bar=True,
                              allreduce="shuffle")
        opt.set_validation(test, EveryEpoch(), [Top1Accuracy(), Loss()])
        bar, stderr = io.StringIO(), sys.stderr
        sys.stderr = bar                   # the console bar writes to stderr
        try:
            opt.optimize()
        finally:
            sys.stderr = stderr
        record = {
            "setup": {"model": "LeNet-5", "data": f"Fashion-MNIST, {TRAIN_SAMPLES} training images",
                      "epochs": EPOCHS, "batch_size": BATCH, "partitions": 2,
                      "master": "local[2]", "optimizer": "Adam lr 0.003",
                      "allreduce": "shuffle"},
            "iterations": [dataclasses.asdict(r) | {"executors": {}}
                           for r in opt.summary.iterations],
            "validations": [dataclasses.asdict(v) for v in opt.summary.validations],
            "progress_bar": terminal_lines(bar.getvalue()),
        }
    finally:
        spark.stop()
    with open(os.path.join(HERE, "fit_record.json"), "w") as out:
        json.dump(record, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
