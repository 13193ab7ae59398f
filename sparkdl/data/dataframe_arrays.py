"""DataFrame columns to numpy arrays through Arrow batches (never ``Row`` objects).

The estimators accept features as a Vector column (dense or sparse), an ``array<numeric>``
column, a list of numeric columns, or an image column read by ``spark.read.format("image")``.
:func:`feature_source` inspects the schema (no Spark job) and :func:`to_blocks` turns the
DataFrame into an RDD of :class:`~sparkdl.data.records.ArrayBlock` (one per Arrow batch), which the
engine stores as shards. :func:`arrow_features` is shared with inference.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..errors import InvalidArgumentError
from .records import ArrayBlock

__all__ = ["FeatureSource", "feature_source", "feature_expression", "arrow_features",
           "to_blocks", "arrays_to_dataframe", "FEATURES_FIELD", "LABEL_FIELD"]

FEATURES_FIELD = "_sparkdl_features"
LABEL_FIELD = "_sparkdl_label"
_IMAGE_FIELDS = {"origin", "height", "width", "nChannels", "mode", "data"}


@dataclass(frozen=True)
class FeatureSource:
    """Where the features come from: ``kind`` is vector, array, columns or image."""

    kind: str
    columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.columns[0] if len(self.columns) == 1 else str(list(self.columns))


def _column_error(column: str, problem: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Column '{column}' {problem}. Features must be a Vector column, an array<numeric> "
        "column, a list of numeric columns (featuresCols) or an image column; combine other "
        "columns with pyspark.ml.feature.VectorAssembler.")


def feature_source(schema: Any, features_col: str, features_cols: Sequence[str]) -> FeatureSource:
    """Check the feature columns against the DataFrame's schema (no Spark job)."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, NumericType, StructType

    names = schema.fieldNames()
    if features_cols:
        for c in features_cols:
            if c not in names:
                raise InvalidArgumentError(f"Column '{c}' (in featuresCols) does not exist; the "
                                           f"DataFrame has columns {names}.")
            if not isinstance(schema[c].dataType, NumericType):
                raise _column_error(c, f"(in featuresCols) has type "
                                       f"{schema[c].dataType.simpleString()}, not a numeric type")
        return FeatureSource("columns", tuple(features_cols))
    if features_col not in names:
        raise InvalidArgumentError(f"Column '{features_col}' (featuresCol) does not exist; the "
                                   f"DataFrame has columns {names}.")
    dtype = schema[features_col].dataType
    if isinstance(dtype, VectorUDT):
        return FeatureSource("vector", (features_col,))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return FeatureSource("array", (features_col,))
    if isinstance(dtype, StructType) and _IMAGE_FIELDS <= set(dtype.fieldNames()):
        return FeatureSource("image", (features_col,))
    raise _column_error(features_col, f"has type {dtype.simpleString()}")


def feature_expression(source: FeatureSource) -> Any:
    """A Spark column holding the features in a form Arrow hands over as one list array."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if source.kind == "vector":
        return vector_to_array(F.col(source.columns[0]), "float32")
    if source.kind == "array":
        return F.col(source.columns[0]).cast("array<float>")
    if source.kind == "columns":
        return F.array(*[F.col(c).cast("float") for c in source.columns])
    return F.col(source.columns[0])


def _list_to_matrix(column: pa.Array, what: str) -> np.ndarray:
    if column.null_count:
        raise ValueError(f"{what} has null values")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = np.asarray(column.offsets)
    lengths = np.diff(offsets)
    if len(lengths) and (lengths != lengths[0]).any():
        raise ValueError(f"{what} has rows of different lengths "
                         f"({int(lengths.min())} to {int(lengths.max())} values)")
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(column), int(lengths[0]) if len(lengths) else 0)


def _images_to_array(column: pa.Array, what: str) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    heights = column.field("height").to_numpy(zero_copy_only=False)
    widths = column.field("width").to_numpy(zero_copy_only=False)
    channels = column.field("nChannels").to_numpy(zero_copy_only=False)
    if len(column) and (len(set(heights)) > 1 or len(set(widths)) > 1 or len(set(channels)) > 1):
        raise ValueError(f"{what} holds images of different sizes; resize them to one size")
    data = column.field("data")
    raw = np.frombuffer(b"".join(data.to_pylist()), dtype=np.uint8)
    if not len(column):
        return np.zeros((0, 0, 0, 0), np.float32)
    h, w, c = int(heights[0]), int(widths[0]), int(channels[0])
    # Spark's image source stores height x width x channels bytes (BGR order); models take CxHxW.
    return raw.reshape(len(column), h, w, c).transpose(0, 3, 1, 2).astype(np.float32) / 255.0


def arrow_features(column: pa.Array, source: FeatureSource, feature_shape: Sequence[int],
                   preprocess: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    """One Arrow batch of the feature column as a float32 array (reshaped, preprocessed)."""
    what = f"Column '{source.name}'"
    x = (_images_to_array(column, what) if source.kind == "image"
         else _list_to_matrix(column, what).astype(np.float32, copy=False))
    if feature_shape:
        per_row = int(np.prod(x.shape[1:]))
        if per_row != int(np.prod(feature_shape)):
            raise ValueError(f"{what} has {per_row} values per row, which cannot be reshaped to "
                             f"featureShape {list(feature_shape)}")
        x = x.reshape(len(x), *feature_shape)
    if x.size and not np.isfinite(x).all():
        raise ValueError(f"{what} has NaN or infinite values")
    if preprocess is not None:
        x = np.asarray(preprocess(x))
    return x


def _labels(column: pa.Array, label_col: str, classifier: bool) -> np.ndarray:
    what = f"Column '{label_col}' (labelCol)"
    if isinstance(column.type, (pa.ListType, pa.LargeListType)):
        y = _list_to_matrix(column, what).astype(np.float32)
    else:
        if column.null_count:
            raise ValueError(f"{what} has null values")
        y = column.to_numpy(zero_copy_only=False).astype(np.float64)
    if not np.isfinite(y).all():
        raise ValueError(f"{what} has NaN or infinite values")
    if classifier:
        if y.ndim != 1 or (y != np.round(y)).any() or (y < 0).any():
            raise ValueError(f"{what} must hold 0-based class indices 0..K-1 (whole numbers "
                             f">= 0); found values such as {y[(y != np.round(y)) | (y < 0)][:3]}")
        return y.astype(np.int64)
    return y.astype(np.float32)


_BLOCK_BYTES = 4 << 20
"""Largest Arrow slice turned into one block: each block is one binary value in the JVM (copied a
few times on its way to Python), so bounding it keeps a 1 GiB executor heap enough for wide rows."""


def _slices(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    rows = batch.num_rows
    if rows == 0:
        yield batch
        return
    per_chunk = max(1, rows * max_bytes // max(1, batch.nbytes))
    for start in range(0, rows, per_chunk):
        yield batch.slice(start, per_chunk)


def to_blocks(df: Any, source: FeatureSource, label_col: str, classifier: bool,
              feature_shape: Sequence[int], preprocess: Any, partitions: int) -> Any:
    """The rows of ``df`` as an RDD of ArrayBlocks, one per Arrow batch, in ``partitions``."""
    from pyspark.sql import functions as F

    selected = df.select(feature_expression(source).alias(FEATURES_FIELD),
                         F.col(label_col).alias(LABEL_FIELD))
    if partitions and partitions != selected.rdd.getNumPartitions():
        selected = selected.repartition(partitions)
    shape = list(feature_shape)

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for whole in batches:
            for batch in _slices(whole, _BLOCK_BYTES):
                try:
                    block = ArrayBlock([arrow_features(batch.column(0), source, shape,
                                                       preprocess)],
                                       _labels(batch.column(1), label_col, classifier))
                except ValueError as exc:
                    block = ArrayBlock([], np.zeros(0), error=str(exc))
                payload = pickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL)
                yield pa.RecordBatch.from_arrays([pa.array([payload], pa.binary())], ["block"])

    blocks = selected.mapInArrow(convert, "block binary")
    return blocks.rdd.map(lambda row: pickle.loads(row[0]))


def arrays_to_dataframe(spark: Any, features: np.ndarray, labels: np.ndarray,
                        features_col: str = "features", label_col: str = "label") -> Any:
    """A DataFrame with an ``array<float>`` features column (each sample flattened) and a label
    column, built through one Arrow table (no Python rows).

    Example: ``df = arrays_to_dataframe(spark, images, labels)``, then
    ``NNClassifier(..., featureShape=[1, 28, 28]).fit(df)``.
    """
    features = np.asarray(features)
    labels = np.asarray(labels)
    if len(features) != len(labels):
        raise InvalidArgumentError(f"features has {len(features)} rows but labels has "
                                   f"{len(labels)}")
    flat = np.ascontiguousarray(features.reshape(len(features), -1), dtype=np.float32)
    offsets = pa.array(np.arange(len(flat) + 1, dtype=np.int64) * flat.shape[1])
    column = pa.LargeListArray.from_arrays(offsets, pa.array(flat.ravel()))
    return spark.createDataFrame(pa.table({features_col: column.cast(pa.list_(pa.float32())),
                                           label_col: pa.array(labels)}))
