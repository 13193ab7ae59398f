"""LeNet-5 on Fashion-MNIST with sparkdl's engine (RDD API, no DataFrames, Adam), with validation
and (optionally) checkpoints.

    spark-submit --master local[2] examples/lenet_fashion_mnist_engine.py --epochs 2
    python examples/lenet_fashion_mnist_engine.py            # embedded local[*] master

Reads the IDX files from --data-dir (Debian: apt-get install dataset-fashion-mnist), trains with
synchronous data-parallel SGD over an RDD, validates on the test set after every epoch, writes a
checkpoint every epoch with --checkpoint-dir (a rerun resumes from it), and ends with the test
accuracy.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch
from torch import nn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sparkdl.datasets import FASHION_MNIST_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=FASHION_MNIST_DIR, help="directory of the IDX files")
    p.add_argument("--master", default="local[*]",
                   help="Spark master when not set by spark-submit")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256, help="global mini-batch size")
    p.add_argument("--learning-rate", type=float, default=0.002)
    p.add_argument("--partitions", type=int, default=0, help="0: Spark's default parallelism")
    p.add_argument("--train-samples", type=int, default=0, help="0: all 60,000")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default="",
                   help="write a checkpoint every epoch here (any Hadoop URI) and resume from it")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is drawn only on a terminal anyway)")
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="exit with status 1 if the final test accuracy is lower")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # INFO for sparkdl's and this script's loggers only: py4j (and anything else) stays at
    # WARNING, else py4j logs every connection it closes at exit
    logging.basicConfig(level=logging.WARNING, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("lenet")
    for name in ("sparkdl", "lenet"):
        logging.getLogger(name).setLevel(logging.INFO)

    from sparkdl.spark_settings import spark_session
    from sparkdl import DistriOptimizer, Loss, Top1Accuracy
    from sparkdl.datasets import fashion_mnist_rdd
    from sparkdl.datasets import lenet5
    from sparkdl.triggers import EveryEpoch, MaxEpoch

    spark = spark_session("sparkdl LeNet-5 Fashion-MNIST (engine)", args.master)
    sc = spark.sparkContext
    sc.setLogLevel("WARN")
    partitions = args.partitions or sc.defaultParallelism
    try:        # the tasks read the IDX files: only their path travels from the driver
        train_rdd = fashion_mnist_rdd(sc, "train", partitions, args.data_dir, standardize=True,
                                      samples=args.train_samples)
        test_rdd = fashion_mnist_rdd(sc, "test", partitions, args.data_dir, standardize=True)
    except FileNotFoundError as exc:
        log.error("%s", exc)
        spark.stop()
        return 2

    torch.manual_seed(args.seed)
    net = lenet5()
    optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate)
    opt = DistriOptimizer(net, train_rdd, nn.CrossEntropyLoss(), optimizer,
                          batch_size=args.batch_size, end_trigger=MaxEpoch(args.epochs),
                          seed=args.seed, progress_bar=False if args.no_progress else None)
    opt.set_validation(test_rdd, EveryEpoch(), [Top1Accuracy(), Loss()])
    if args.checkpoint_dir:
        opt.set_checkpoint(args.checkpoint_dir, EveryEpoch(), keep_last=2)
    start = time.time()
    opt.optimize()
    accuracy = opt.summary.validations[-1].metrics["Top1Accuracy"]
    log.info("trained %d epoch(s) on %d samples in %.0f s", args.epochs,
             min(args.train_samples or 60000, 60000), time.time() - start)
    print(f"test accuracy: {accuracy:.4f}")
    spark.stop()
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
