"""Every difference between the pyspark versions sparkdl supports, in one place.

sparkdl runs on classic sessions of pyspark 3.4, 3.5, 4.0 and 4.x, and on Spark Connect from
pyspark 4.1. The rest of the package calls the functions here and never tests a version itself.

What differs (README, "Spark versions"):

- ``local_connect_and_auth`` (the driver's end of a result socket) moved from
  ``pyspark.java_gateway`` to ``pyspark.util`` in 4.0.
- ``pyspark.sql.functions.arrow_udf`` (an iterator UDF over Arrow arrays) is new in 4.1; before,
  ``transform`` runs the same function through an iterator ``pandas_udf``, converting Spark's
  pandas batches back to Arrow (:func:`arrow_iterator_udf`).
- ``DefaultParamsWriter.saveMetadata`` and ``DefaultParamsReader.loadMetadata`` take a
  SparkSession from 4.0, a SparkContext before.
- ``spark.createDataFrame(pyarrow.Table)`` is new in 4.0; before, the table goes through pandas
  with Arrow conversion on (:func:`dataframe_from_arrow`).
- ``HasBatchSize``, ``HasLearningRate``, ``HasMomentum`` and ``HasNumTrainWorkers`` arrived in
  3.5; on 3.4 they are defined here, with the same names, docs and defaults.
- ``spark.python.unix.domain.socket.enabled`` is new in 4.1; before, the JVM reaches its Python
  workers over loopback TCP (the setting is then ignored; bench/RESULTS.md measures the cost).
- Spark Connect: the 3.x and 4.0 clients lack what the Connect runner uses (``localCheckpoint``,
  ``toArrow``, ``repartitionById``), so a Connect session on pyspark older than 4.1 is refused
  by :func:`check_connect_supported` before any work.

Example::

    from sparkdl.spark_compat import PYSPARK_VERSION, dataframe_from_arrow
    df = dataframe_from_arrow(spark, pyarrow.table({"x": [1.0, 2.0]}))
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable, Iterator, Tuple

import pyarrow as pa
import pyspark

from .errors import InvalidArgumentError

__all__ = ["PYSPARK_VERSION", "LOWEST_CONNECT_PYSPARK",
           "version_tuple", "local_connect_and_auth", "arrow_iterator_udf", "save_metadata",
           "load_metadata", "dataframe_from_arrow", "check_connect_supported",
           "HasBatchSize", "HasLearningRate", "HasMomentum", "HasNumTrainWorkers"]


def version_tuple(version: str) -> tuple[int, int, int]:
    """``"3.5.9"`` -> ``(3, 5, 9)``; pre-release and dev suffixes are dropped
    (``"4.1.0.dev0"`` -> ``(4, 1, 0)``).

    Example: ``version_tuple(pyspark.__version__) >= (4, 1, 0)``.
    """
    parts = [int(m) for m in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


PYSPARK_VERSION = version_tuple(pyspark.__version__)
"""The installed pyspark as ``(major, minor, patch)``."""

LOWEST_CONNECT_PYSPARK = (4, 1, 0)
"""The oldest pyspark whose Spark Connect client has what sparkdl's Connect runner uses."""

_HAS_ARROW_UDF = PYSPARK_VERSION >= (4, 1, 0)
_METADATA_TAKES_SESSION = PYSPARK_VERSION >= (4, 0, 0)
_CREATES_FROM_ARROW = PYSPARK_VERSION >= (4, 0, 0)


def _import_local_connect_and_auth() -> Callable[..., Any]:
    try:
        from pyspark.util import local_connect_and_auth as found       # 4.0 and newer
    except ImportError:
        from pyspark.java_gateway import local_connect_and_auth as found  # 3.4, 3.5
    return found


local_connect_and_auth = _import_local_connect_and_auth()
"""``local_connect_and_auth(port, auth_secret) -> (stream, socket)``: the driver's end of a
socket the JVM serves results on (what ``RDD.collect`` uses)."""


# --- transform's UDF ---------------------------------------------------------------------------

def arrow_iterator_udf(function: Callable[[Iterator[Any]], Iterator[pa.Array]],
                       return_type: str) -> Any:
    """A Spark UDF running ``function`` over batches of its input columns as Arrow arrays.

    ``function`` gets an iterator of batches (one ``pa.Array`` per batch for one input column,
    a tuple of them for several) and yields one ``pa.Array`` of ``return_type`` (a DDL string)
    per batch. pyspark 4.1+: ``arrow_udf`` directly. Older: an iterator ``pandas_udf`` whose
    pandas batches are turned back into Arrow arrays, and whose outputs are turned into pandas
    (a struct return type as a DataFrame of its fields). Values without nulls arrive as the
    same arrays either way; pandas cannot keep what tells a null from a NaN, so there a
    float column's NaN arrives as null, and an integer column with nulls as doubles with
    nulls (a null row of a struct column stays a null row).

    Example::

        def plus_one(batches):
            for column in batches:
                yield pyarrow.compute.add(column, 1.0)
        df.withColumn("y", arrow_iterator_udf(plus_one, "double")("x"))
    """
    if _HAS_ARROW_UDF:
        from pyspark.sql.functions import arrow_udf

        def over_arrow_batches(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
            return function(batches)     # the type hints make arrow_udf an iterator UDF

        return arrow_udf(over_arrow_batches, return_type)
    return _pandas_iterator_udf(function, return_type)


def _to_arrow(column: Any) -> pa.Array:
    """A pandas column from Spark's Arrow batch, back in Arrow: a struct column (a DataFrame of
    its fields) as a struct array, lists of numpy arrays as list arrays; missing values stay
    null."""
    import pandas as pd

    if isinstance(column, pd.DataFrame):     # a null struct row: every field null in pandas
        null_rows = pa.array(column.isna().all(axis=1).to_numpy(), pa.bool_())
        return pa.StructArray.from_arrays([_to_arrow(column[name]) for name in column.columns],
                                          names=[str(name) for name in column.columns],
                                          mask=null_rows)
    return pa.array(column, from_pandas=True)


def _to_pandas(array: pa.Array) -> Any:
    """An output array as pandas_udf wants it: a struct array as a DataFrame of its fields, any
    other array as a Series."""
    import pandas as pd

    if pa.types.is_struct(array.type):
        fields = {array.type.field(i).name: array.field(i) for i in range(array.type.num_fields)}
        return pd.DataFrame({name: _to_pandas(column) for name, column in fields.items()})
    return pd.Series(array.to_pandas(zero_copy_only=False))


def _pandas_iterator_udf(function: Callable[[Iterator[Any]], Iterator[pa.Array]],
                         return_type: str) -> Any:
    from pyspark.sql.functions import PandasUDFType, pandas_udf

    def through_pandas(batches: Iterator[Any]) -> Iterator[Any]:
        def as_arrow() -> Iterator[Any]:
            for batch in batches:
                if isinstance(batch, tuple):
                    yield tuple(_to_arrow(series) for series in batch)
                else:
                    yield _to_arrow(batch)

        for out in function(as_arrow()):
            yield _to_pandas(out)

    with warnings.catch_warnings():     # PandasUDFType is deprecated in favour of type hints,
        warnings.simplefilter("ignore")  # which cannot say "one column or several" at once
        return pandas_udf(through_pandas, return_type, PandasUDFType.SCALAR_ITER)


# --- ML persistence ----------------------------------------------------------------------------

def _metadata_context(spark: Any) -> Any:
    return spark if _METADATA_TAKES_SESSION else spark.sparkContext


def save_metadata(instance: Any, path: str, spark: Any, **kwargs: Any) -> None:
    """``DefaultParamsWriter.saveMetadata(instance, path, <session or context>, **kwargs)``."""
    from pyspark.ml.util import DefaultParamsWriter

    DefaultParamsWriter.saveMetadata(instance, path, _metadata_context(spark), **kwargs)


def load_metadata(path: str, spark: Any) -> dict[str, Any]:
    """``DefaultParamsReader.loadMetadata(path, <session or context>)``."""
    from pyspark.ml.util import DefaultParamsReader

    return DefaultParamsReader.loadMetadata(path, _metadata_context(spark))


# --- DataFrames from Arrow ---------------------------------------------------------------------

def dataframe_from_arrow(spark: Any, table: pa.Table) -> Any:
    """A DataFrame holding ``table`` (pyspark 4.0+: ``spark.createDataFrame(table)``; older:
    through pandas with Spark's Arrow conversion on for this call, the schema taken from the
    table, so list columns keep their element type; there a float NaN arrives as null, and the
    session setting is switched for the call, so do not call it from two threads at once).

    Example: ``dataframe_from_arrow(spark, pyarrow.table({"label": [0, 1]}))``.
    """
    if _CREATES_FROM_ARROW:
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table.schema)
    key = "spark.sql.execution.arrow.pyspark.enabled"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "true")
    try:
        return spark.createDataFrame(table.to_pandas(), schema=schema)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


# --- Spark Connect -----------------------------------------------------------------------------

def check_connect_supported() -> None:
    """Raise :class:`~sparkdl.errors.InvalidArgumentError` where this pyspark's Spark Connect
    client is older than :data:`LOWEST_CONNECT_PYSPARK` (called before any work on a Connect
    session)."""
    if PYSPARK_VERSION < LOWEST_CONNECT_PYSPARK:
        raise InvalidArgumentError(
            f"sparkdl on Spark Connect needs pyspark {'.'.join(map(str, LOWEST_CONNECT_PYSPARK))}"
            f" or newer; this is pyspark {pyspark.__version__}, whose Connect client lacks "
            "DataFrame.localCheckpoint, toArrow and repartitionById. Use a classic session "
            "(SparkSession.builder without .remote(...)) on this version, or upgrade pyspark.")


# --- Params that arrived in pyspark 3.5 --------------------------------------------------------

try:
    from pyspark.ml.param.shared import (HasBatchSize, HasLearningRate, HasMomentum,
                                         HasNumTrainWorkers)
except ImportError:                     # pyspark 3.4: the same mixins as 3.5 defines them
    from pyspark.ml.param import Param, Params, TypeConverters

    class HasNumTrainWorkers(Params):   # type: ignore[no-redef]
        """Mixin for param numTrainWorkers: number of training workers."""

        numTrainWorkers: "Param[int]" = Param(Params._dummy(), "numTrainWorkers",
                                              "number of training workers",
                                              typeConverter=TypeConverters.toInt)

        def __init__(self) -> None:
            super().__init__()
            self._setDefault(numTrainWorkers=1)

        def getNumTrainWorkers(self) -> int:
            """Gets the value of numTrainWorkers or its default value."""
            return self.getOrDefault(self.numTrainWorkers)

    class HasBatchSize(Params):         # type: ignore[no-redef]
        """Mixin for param batchSize: number of training batch size."""

        batchSize: "Param[int]" = Param(Params._dummy(), "batchSize",
                                        "number of training batch size",
                                        typeConverter=TypeConverters.toInt)

        def getBatchSize(self) -> int:
            """Gets the value of batchSize or its default value."""
            return self.getOrDefault(self.batchSize)

    class HasLearningRate(Params):      # type: ignore[no-redef]
        """Mixin for param learningRate: learning rate for training."""

        learningRate: "Param[float]" = Param(Params._dummy(), "learningRate",
                                             "learning rate for training",
                                             typeConverter=TypeConverters.toFloat)

        def getLearningRate(self) -> float:
            """Gets the value of learningRate or its default value."""
            return self.getOrDefault(self.learningRate)

    class HasMomentum(Params):          # type: ignore[no-redef]
        """Mixin for param momentum: momentum for training optimizer."""

        momentum: "Param[float]" = Param(Params._dummy(), "momentum",
                                         "momentum for training optimizer",
                                         typeConverter=TypeConverters.toFloat)

        def getMomentum(self) -> float:
            """Gets the value of momentum or its default value."""
            return self.getOrDefault(self.momentum)

