"""LeNet-5 on Fashion-MNIST with sparkdl's DataFrame API (NNClassifier), to >= 0.89 test accuracy.

    spark-submit --master local[2] examples/lenet_fashion_mnist_dataframe.py
    python examples/lenet_fashion_mnist_dataframe.py --epochs 2      # embedded local[*] master

Reads the IDX files from --data-dir (Debian: apt-get install dataset-fashion-mnist) into two
DataFrames (a 784-float array column and a label column), fits an NNClassifier that reshapes each
row to 1x28x28 and standardizes it on the executors, reports the per-epoch summary (training
loss, test loss and accuracy), optionally saves the fitted model, and ends with the test accuracy
from Spark's MulticlassClassificationEvaluator.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np


def standardize(x: np.ndarray) -> np.ndarray:
    """Pixels in [0, 1] to zero mean, unit variance (Fashion-MNIST's training statistics)."""
    from sparkdl.datasets import FASHION_MNIST_MEAN, FASHION_MNIST_STD

    return (x - FASHION_MNIST_MEAN) / FASHION_MNIST_STD


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sparkdl.datasets import FASHION_MNIST_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=FASHION_MNIST_DIR, help="directory of the IDX files")
    p.add_argument("--master", default="local[*]",
                   help="Spark master when not set by spark-submit")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=512, help="global mini-batch size")
    p.add_argument("--learning-rate", type=float, default=0.005, help="Adam's learning rate")
    p.add_argument("--partitions", type=int, default=0, help="0: Spark's default parallelism")
    p.add_argument("--train-samples", type=int, default=0, help="0: all 60,000")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", default="", help="save the fitted NNClassifierModel here")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is drawn only on a terminal anyway)")
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="exit with status 1 if the final test accuracy is lower")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # INFO for sparkdl's and this script's loggers only (py4j stays at WARNING, else it logs
    # every connection it closes at exit)
    logging.basicConfig(level=logging.WARNING, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("lenet-df")
    for name in ("sparkdl", "lenet-df"):
        logging.getLogger(name).setLevel(logging.INFO)
    import torch
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql import functions as F

    from sparkdl.spark_settings import spark_session
    from sparkdl import NNClassifier
    from sparkdl.data.dataframe_arrays import arrays_to_dataframe
    from sparkdl.datasets import load_fashion_mnist
    from sparkdl.datasets import lenet5

    try:
        train_x, train_y, test_x, test_y = load_fashion_mnist(args.data_dir)
    except FileNotFoundError as exc:
        log.error("%s", exc)
        return 2
    if args.train_samples:
        train_x, train_y = train_x[:args.train_samples], train_y[:args.train_samples]

    spark = spark_session("sparkdl LeNet-5 Fashion-MNIST (DataFrame)", args.master)
    spark.sparkContext.setLogLevel("WARN")
    # The test rows ride along as validation rows: the summary then holds test loss and
    # accuracy after every epoch. They never reach the gradient.
    train = arrays_to_dataframe(spark, train_x, train_y).withColumn("isTest", F.lit(False))
    test = arrays_to_dataframe(spark, test_x, test_y)
    data = train.unionByName(test.withColumn("isTest", F.lit(True)))
    log.info("%d training rows, %d test rows", len(train_y), len(test_y))

    clf = NNClassifier(model=lenet5, criterion=torch.nn.CrossEntropyLoss(),
                       preprocess=standardize, featuresCol="features", labelCol="label",
                       featureShape=[1, 28, 28], validationIndicatorCol="isTest",
                       batchSize=args.batch_size, maxEpoch=args.epochs, optimizer="adam",
                       learningRate=args.learning_rate, seed=args.seed,
                       numTrainWorkers=args.partitions, progressBar=not args.no_progress)
    start = time.time()
    model = clf.fit(data)
    log.info("fitted %d epoch(s) in %.0f s; per-epoch summary:\n%s", args.epochs,
             time.time() - start, model.summary.to_string(index=False))
    if args.model_dir:
        model.write().overwrite().save(args.model_dir)
        log.info("model saved to %s", args.model_dir)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(
        model.transform(test))
    print(f"test accuracy: {accuracy:.4f}")
    spark.stop()
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
