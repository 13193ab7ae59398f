"""sparkdl.spark_compat: what differs between pyspark versions, checked on whichever pyspark runs
the tests (.ci/run runs this file under 3.4, 3.5, 4.0, 4.1 and the newest)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyspark
import pytest

from sparkdl.errors import InvalidArgumentError
from sparkdl.spark_compat import (LOWEST_CONNECT_PYSPARK, PYSPARK_VERSION, _pandas_iterator_udf,
                                  arrow_iterator_udf, check_connect_supported,
                                  dataframe_from_arrow, version_tuple)


def test_version_tuple_reads_releases_and_dev_builds():
    assert version_tuple("3.5.9") == (3, 5, 9)
    assert version_tuple("4.1.0.dev0") == (4, 1, 0)
    assert version_tuple("4.0") == (4, 0, 0)
    assert PYSPARK_VERSION == version_tuple(pyspark.__version__)


def test_a_connect_session_on_an_older_pyspark_is_refused_naming_the_version():
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from sparkdl.storage.file_systems import is_connect_session

    session = ConnectSession.__new__(ConnectSession)    # what .remote(...) returns
    if PYSPARK_VERSION >= LOWEST_CONNECT_PYSPARK:
        check_connect_supported()
        assert is_connect_session(session)
    else:
        with pytest.raises(InvalidArgumentError, match=r"needs pyspark 4\.1\.0 or newer; this "
                           rf"is pyspark {pyspark.__version__}"):
            is_connect_session(session)
    assert not is_connect_session(object())


def test_dataframe_from_arrow_keeps_types_values_and_the_session_conf(spark):
    key = "spark.sql.execution.arrow.pyspark.enabled"
    before = spark.conf.get(key, None)
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = pa.table({"features": pa.array(list(values), pa.list_(pa.float32())),
                      "label": pa.array([0, 1, 2, 3], pa.int64()),
                      "weight": pa.array([0.5, None, 1.5, 2.0], pa.float64())})
    df = dataframe_from_arrow(spark, table)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == \
        [("features", "array<float>"), ("label", "bigint"), ("weight", "double")]
    rows = df.orderBy("label").collect()
    assert [r.features for r in rows] == values.tolist()
    assert [r.weight for r in rows] == [0.5, None, 1.5, 2.0]
    assert spark.conf.get(key, None) == before


def _batches_through(udf_of, spark):
    """Run a UDF made by ``udf_of`` over one column, then a struct-valued one over two; each
    function checks the Arrow types it is given (an error fails the job)."""
    def one(batches):
        for column in batches:
            assert column.type == pa.float64(), column.type
            yield pa.compute.add(column, 1.0)

    def several(batches):
        for x, ys in batches:
            assert (x.type, ys.type) == (pa.float64(), pa.list_(pa.float64())), (x.type, ys.type)
            sums = [-1.0 if v is None else float(np.sum(v)) for v in ys.to_pylist()]
            yield pa.StructArray.from_arrays(
                [pa.array(sums, pa.float64()), pa.array([[s, -s] for s in sums],
                                                        pa.list_(pa.float64()))],
                names=["total", "pair"])

    df = spark.createDataFrame([(1.0, [1.0, 2.0]), (2.0, None), (3.0, [])],
                               "x double, ys array<double>").coalesce(1)
    out = df.select(udf_of(one, "double")("x").alias("y"),
                    udf_of(several, "struct<total: double, pair: array<double>>")(
                        "x", "ys").alias("s")).collect()
    return [r.y for r in out], [(r.s.total, r.s.pair) for r in out]


def test_both_udf_paths_give_the_function_the_same_arrow_arrays_and_results(spark):
    """arrow_iterator_udf (pyspark's arrow_udf from 4.1) and the pandas path of older versions:
    the same input types and values reach the function, the same outputs come back (on
    pyspark before 4.1 both calls take the pandas path)."""
    direct = _batches_through(arrow_iterator_udf, spark)
    via_pandas = _batches_through(_pandas_iterator_udf, spark)
    assert direct[0] == via_pandas[0] == [2.0, 3.0, 4.0]
    assert direct[1] == via_pandas[1] == [(3.0, [3.0, -3.0]), (-1.0, [-1.0, 1.0]),
                                          (0.0, [0.0, -0.0])]   # a null list stays null


def test_a_null_struct_row_stays_null_on_both_udf_paths(spark):
    """An image-like struct column with a null row: the function sees that row as null (and
    the other rows' fields) whichever path carries the batch."""
    def nulls(batches):
        for column in batches:
            assert pa.types.is_struct(column.type), column.type
            yield pa.array([None if column[i].is_valid is False else
                            int(column.field("height")[i].as_py()) + len(column.field("data")[i]
                                                                         .as_py())
                            for i in range(len(column))], pa.int64())

    df = spark.createDataFrame([((2, b"abc"),), (None,), ((5, b""),)],
                               "image struct<height: int, data: binary>").coalesce(1)
    direct = [r.v for r in df.select(arrow_iterator_udf(nulls, "bigint")("image").alias("v"))
              .collect()]
    via_pandas = [r.v for r in df.select(_pandas_iterator_udf(nulls, "bigint")("image")
                                         .alias("v")).collect()]
    assert direct == via_pandas == [5, None, 5]
