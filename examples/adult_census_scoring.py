"""Scores a new table with the PipelineModel that examples/adult_census_tables.py saved, and
writes the predictions as a table.

    python examples/adult_census_scoring.py --table adult_test --output-table adult_test_scored
    spark-submit --master local[2] examples/adult_census_scoring.py --input adult-parquet/adult_test

A separate job from the one that trained: it loads the model from ``--model-dir``
(``PipelineModel.load``), reads the rows from the catalog (``--table``) or Parquet files
(``--input``), and writes their columns with ``prediction`` and ``prob_over_50k`` to
``--output-table``. Give it the training job's ``--catalog-dir`` to see that job's tables. The
rows need the training table's attribute columns; a ``label`` column, when present, gives an
accuracy as well.
"""

from __future__ import annotations

import argparse
import os
import sys

# The training job's catalog and table helpers (this folder is on the path under python and
# spark-submit alike: the script's own folder).
from adult_census_pipeline import console_logging
from adult_census_tables import (add_io_arguments, catalog_session, prediction_table, read_input,
                                 storage_path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_io_arguments(p)
    p.add_argument("--model-dir", default="adult-pipeline-model",
                   help="the PipelineModel the training job saved")
    p.add_argument("--output-table", default="adult_scored",
                   help="catalog table the predictions are written to")
    args = p.parse_args(argv)
    log = console_logging("adult")
    model_dir = storage_path(args.model_dir)
    if "://" not in model_dir and not os.path.isdir(model_dir):
        log.error("--model-dir %s: no saved PipelineModel there (the training job's "
                  "--model-dir)", model_dir)
        return 2

    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    spark = catalog_session("sparkdl Adult census scoring", args.master, args.catalog_dir)
    spark.sparkContext.setLogLevel("WARN")
    try:
        rows = read_input(spark, args.table, args.input)
    except ValueError as exc:
        log.error("%s", exc)
        spark.stop()
        return 2
    model = PipelineModel.load(model_dir)       # unpickles the model: load only what you trust
    scored = model.transform(rows)
    prediction_table(scored, rows.columns).write.mode("overwrite").saveAsTable(args.output_table)
    written = spark.table(args.output_table)
    log.info("wrote table %s (%d rows)", args.output_table, written.count())
    if "label" in rows.columns:
        accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(written)
        print(f"accuracy on the new rows: {accuracy:.4f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
