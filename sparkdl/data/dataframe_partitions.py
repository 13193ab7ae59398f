"""How many partitions a DataFrame has, and the cluster's default parallelism, on a classic
session (from the SparkContext, no job) and under Spark Connect, which has neither RDDs nor a
SparkContext (one small job each).

Example::

    partition_count(df)            # 4
    default_parallelism(spark)     # what sc.defaultParallelism says on a classic session
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa

from ..storage.file_systems import is_connect_session

__all__ = ["partition_count", "default_parallelism"]


def _one_row_per_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:      # read everything: a worker that stops early is not reused
        pass
    yield pa.RecordBatch.from_arrays([pa.array([1], pa.int64())], ["one"])


def partition_count(df: Any) -> int:
    """``df.rdd.getNumPartitions()`` on a classic session; under Connect a job over ``df``
    with no column read (Spark calls a ``mapInArrow`` function on empty partitions too)."""
    if not is_connect_session(df.sparkSession):
        return int(df.rdd.getNumPartitions())
    from pyspark.sql import functions as F

    marks = df.select(F.lit(0).alias("_sparkdl_zero")).mapInArrow(_one_row_per_partition,
                                                                  "one long")
    return int(marks.count())


def default_parallelism(spark: Any) -> int:
    """The SparkContext's ``defaultParallelism``; under Connect the partitions Spark gives a
    ``range`` (which is that number unless ``spark.sql.leafNodeDefaultParallelism`` is set)."""
    if not is_connect_session(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    last = spark.range(0, 1 << 20).select(F.max(F.spark_partition_id())).first()[0]
    return int(last) + 1
