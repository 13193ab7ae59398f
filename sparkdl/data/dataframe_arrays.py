"""DataFrame columns to numpy arrays through Arrow batches (never ``Row`` objects).

The estimators take the model's inputs from the DataFrame in one of two ways:

* one input: ``featuresCol`` (a Vector column, dense or sparse; an ``array<numeric>`` column; an
  image column read by ``spark.read.format("image")``) or ``featuresCols`` (numeric columns
  side by side);
* several inputs: ``inputCols``, one column per model argument in order (``model(*inputs)``),
  each a Vector, a numeric array, a numeric scalar or an image column.

Integer columns (scalars and arrays) reach the model as int64 (ids for ``nn.Embedding``);
floating ones in the model's float dtype; Vectors and ``featuresCols`` (assembled side by side,
as ``VectorAssembler`` would) as floats; images as float ``C x H x W`` in [0, 1].

:func:`feature_sources` inspects the schema (no Spark job) and :func:`to_blocks` turns the
DataFrame into an RDD of :class:`~sparkdl.data.records.ArrayBlock` (one per Arrow batch), which
the engine stores as shards. :func:`arrow_inputs` is shared with inference.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..errors import InvalidArgumentError
from ..spark_compat import dataframe_from_arrow
from .ragged import Ragged
from .records import ArrayBlock

__all__ = ["FeatureSource", "feature_sources", "feature_expression", "arrow_features",
           "arrow_inputs", "input_expressions", "check_label_column", "check_weight_column",
           "to_blocks", "frame_blocks", "BlockConverter", "DataFrameBlocks",
           "arrays_to_dataframe", "LABEL_FIELD", "numpy_float_dtype"]

LABEL_FIELD = "_sparkdl_label"
_IMAGE_FIELDS = {"origin", "height", "width", "nChannels", "mode", "data"}


@dataclass(frozen=True)
class FeatureSource:
    """Where one model input comes from: ``kind`` is vector, array, scalar, columns or image;
    ``integral``: integer values, kept as int64."""

    kind: str
    columns: tuple[str, ...]
    integral: bool = False
    ragged: bool = False     # an array column whose rows vary in length (sequenceCols)

    @property
    def name(self) -> str:
        return self.columns[0] if len(self.columns) == 1 else str(list(self.columns))


def numpy_float_dtype(model: Any) -> np.dtype:
    """The numpy dtype floating inputs take for ``model``: its first floating parameter's
    (float32 for bfloat16/float16 models and models without parameters; the model casts)."""
    for p in model.parameters():
        if p.is_floating_point():
            return np.dtype(np.float64) if str(p.dtype) == "torch.float64" else \
                np.dtype(np.float32)
    return np.dtype(np.float32)


def _column_error(column: str, problem: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Column '{column}' {problem}. Features must be a Vector column, an array<numeric> "
        "column, a list of numeric columns (featuresCols), an image column, or one such column "
        "(or a numeric scalar column) per model input (inputCols); combine other columns with "
        "pyspark.ml.feature.VectorAssembler.")


def _missing(column: str, param: str, names: list[str]) -> InvalidArgumentError:
    return InvalidArgumentError(f"Column '{column}' ({param}) does not exist; the DataFrame has "
                                f"columns {names}.")


def _one_column(schema: Any, column: str, param: str, scalar_ok: bool) -> FeatureSource:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, IntegralType, NumericType, StructType

    if column not in schema.fieldNames():
        raise _missing(column, param, schema.fieldNames())
    dtype = schema[column].dataType
    if isinstance(dtype, VectorUDT):
        return FeatureSource("vector", (column,))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return FeatureSource("array", (column,), isinstance(dtype.elementType, IntegralType))
    if isinstance(dtype, StructType) and _IMAGE_FIELDS <= set(dtype.fieldNames()):
        return FeatureSource("image", (column,))
    if scalar_ok and isinstance(dtype, NumericType):
        return FeatureSource("scalar", (column,), isinstance(dtype, IntegralType))
    raise _column_error(column, f"({param}) has type {dtype.simpleString()}")


def feature_sources(schema: Any, features_col: str, features_cols: Sequence[str],
                    input_cols: Sequence[str] = (), sequence_cols: Sequence[str] = ()
                    ) -> list[FeatureSource]:
    """The model's inputs, checked against the DataFrame's schema (no Spark job): one per
    column of ``input_cols`` when given, else the one of ``features_cols`` or ``features_col``;
    the array columns in ``sequence_cols`` are variable-length."""
    from dataclasses import replace

    from pyspark.sql.types import NumericType

    names = schema.fieldNames()
    if input_cols or sequence_cols:
        columns = list(input_cols) or [features_col]
        param = "in inputCols" if input_cols else "featuresCol"
        sources = [_one_column(schema, c, param, scalar_ok=bool(input_cols)) for c in columns]
        for c in sequence_cols:
            if c not in columns:
                raise InvalidArgumentError(
                    f"Column '{c}' (in sequenceCols) is not one of the model's input columns "
                    f"{columns}.")
        sources = [replace(s, ragged=True) if s.columns[0] in sequence_cols else s
                   for s in sources]
        for s in sources:
            if s.ragged and s.kind != "array":
                raise _column_error(s.columns[0], f"(in sequenceCols) is a {s.kind} column, "
                                                  "not an array<numeric> column")
        return sources
    if features_cols:
        for c in features_cols:
            if c not in names:
                raise _missing(c, "in featuresCols", names)
            if not isinstance(schema[c].dataType, NumericType):
                raise _column_error(c, f"(in featuresCols) has type "
                                       f"{schema[c].dataType.simpleString()}, not a numeric type")
        # side by side in one float vector, as VectorAssembler would (ids: use inputCols)
        return [FeatureSource("columns", tuple(features_cols))]
    return [_one_column(schema, features_col, "featuresCol", scalar_ok=False)]


def check_weight_column(schema: Any, weight_col: str) -> None:
    """The weight column exists and is numeric, before any Spark job."""
    from pyspark.sql.types import NumericType

    if weight_col not in schema.fieldNames():
        raise _missing(weight_col, "weightCol", schema.fieldNames())
    if not isinstance(schema[weight_col].dataType, NumericType):
        raise InvalidArgumentError(f"Column '{weight_col}' (weightCol) has type "
                                   f"{schema[weight_col].dataType.simpleString()}; sample "
                                   "weights must be numeric (>= 0).")


def check_label_column(schema: Any, label_col: str, classifier: bool = False) -> None:
    """The label column exists and is numeric (or an array of numbers, but for a
    ``classifier``: one class index per row), before any Spark job."""
    from pyspark.sql.types import ArrayType, NumericType, StringType

    if label_col not in schema.fieldNames():
        raise _missing(label_col, "labelCol", schema.fieldNames())
    dtype = schema[label_col].dataType
    if classifier and isinstance(dtype, ArrayType):
        raise InvalidArgumentError(
            f"Column '{label_col}' (labelCol) has type {dtype.simpleString()}; a classifier "
            "takes one 0-based class index per row (a numeric column). Use NNEstimator for "
            "array targets.")
    if isinstance(dtype, NumericType) or (isinstance(dtype, ArrayType) and
                                          isinstance(dtype.elementType, NumericType)):
        return
    hint = (" Index string labels first: pyspark.ml.feature.StringIndexer(inputCol="
            f"'{label_col}', outputCol='label_index') gives 0-based class indices (as doubles)."
            if isinstance(dtype, StringType) else "")
    raise InvalidArgumentError(f"Column '{label_col}' (labelCol) has type "
                               f"{dtype.simpleString()}; labels must be numeric (class indices "
                               f"or regression targets) or arrays of numbers.{hint}")


def feature_expression(source: FeatureSource, float_type: str = "float") -> Any:
    """A Spark column holding one input in a form Arrow hands over as one array (a list array,
    or a primitive one for scalars); floating values as ``float_type`` ("float" or "double")."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    element = "bigint" if source.integral else float_type
    if source.kind == "vector":
        return vector_to_array(F.col(source.columns[0]),
                               "float64" if float_type == "double" else "float32")
    if source.kind == "array":
        return F.col(source.columns[0]).cast(f"array<{element}>")
    if source.kind == "scalar":
        return F.col(source.columns[0]).cast(element)
    if source.kind == "columns":
        return F.array(*[F.col(c).cast(element) for c in source.columns])
    return F.col(source.columns[0])


def input_expressions(sources: Sequence[FeatureSource], float_type: str) -> list[Any]:
    """:func:`feature_expression` of every input, aliased ``_sparkdl_input<k>``."""
    return [feature_expression(s, float_type).alias(f"_sparkdl_input{k}")
            for k, s in enumerate(sources)]


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


def _ragged(column: pa.Array, what: str) -> Ragged:
    """A list column as values plus offsets, without padding (no copy of the values when the
    types allow)."""
    if column.null_count:
        raise ValueError(f"{what} has null values")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = np.asarray(column.offsets).astype(np.int64)
    values = column.flatten().to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise ValueError(f"{what} has NaN or infinite values")
    return Ragged(values, offsets - offsets[0])


def _scalars(column: pa.Array, what: str) -> np.ndarray:
    if column.null_count:
        raise ValueError(f"{what} has null values")
    return column.to_numpy(zero_copy_only=False)


def arrow_features(column: pa.Array, source: FeatureSource, feature_shape: Sequence[int],
                   preprocess: Callable[[np.ndarray], np.ndarray] | None,
                   float_dtype: Any = np.float32) -> np.ndarray:
    """One Arrow batch of one input column as an array: int64 for integer columns, else
    ``float_dtype`` (reshaped to ``feature_shape`` when given, preprocessed)."""
    what = f"Column '{source.name}'"
    if source.ragged:
        r = _ragged(column, what).astype(np.int64 if source.integral else float_dtype)
        return preprocess(r) if preprocess is not None else r
    if source.kind == "image":
        x = _images_to_array(column, what).astype(float_dtype, copy=False)
    elif source.kind == "scalar":
        x = _scalars(column, what)
    else:
        x = _list_to_matrix(column, what)
    x = x.astype(np.int64 if source.integral else float_dtype, copy=False)
    if feature_shape:
        per_row = int(np.prod(x.shape[1:]))
        if per_row != int(np.prod(feature_shape)):
            raise ValueError(f"{what} has {per_row} values per row, which cannot be reshaped to "
                             f"featureShape {list(feature_shape)}")
        x = x.reshape(len(x), *feature_shape)
    if x.size and x.dtype.kind == "f" and not np.isfinite(x).all():
        raise ValueError(f"{what} has NaN or infinite values")
    if preprocess is not None:
        x = np.asarray(preprocess(x))
    return x


def arrow_inputs(columns: Sequence[pa.Array], sources: Sequence[FeatureSource],
                 feature_shape: Sequence[int], preprocess: Any, float_dtype: Any
                 ) -> list[np.ndarray]:
    """One Arrow batch of every input column as arrays, one per model input. With one input,
    ``feature_shape`` and ``preprocess`` apply to it; with several (``inputCols``),
    ``preprocess`` takes the list of arrays and returns a list of the same length."""
    if len(sources) == 1:
        return [arrow_features(columns[0], sources[0], feature_shape, preprocess, float_dtype)]
    xs: list[Any] = [arrow_features(c, s, (), None, float_dtype)
                     for c, s in zip(columns, sources)]
    if preprocess is not None:
        out = preprocess(list(xs))
        if not isinstance(out, (list, tuple)) or len(out) != len(xs):
            raise ValueError(f"preprocess must return a list of {len(xs)} arrays (one per "
                             f"inputCols column); got {type(out).__name__}")
        xs = [x if isinstance(x, Ragged) else np.asarray(x) for x in out]
    return xs


def _labels(column: pa.Array, label_col: str, classifier: bool, float_dtype: Any,
            class_index: bool = False, ignore_label: int | None = None) -> np.ndarray:
    """A label column as the criterion takes it: class indices (a classifier's, or an integer
    column under a class-index criterion) as int64, other values in the model's float dtype
    (float64 labels for a float64 model)."""
    what = f"Column '{label_col}' (labelCol)"
    value_type = column.type.value_type if isinstance(
        column.type, (pa.ListType, pa.LargeListType)) else column.type
    integral = class_index and pa.types.is_integer(value_type)
    if isinstance(column.type, (pa.ListType, pa.LargeListType)):
        y = _list_to_matrix(column, what)
        if not integral:
            y = y.astype(np.float64)
    else:
        if column.null_count:
            raise ValueError(f"{what} has null values")
        y = column.to_numpy(zero_copy_only=False)
        if not integral:
            y = y.astype(np.float64)
    if not integral and not np.isfinite(y).all():
        raise ValueError(f"{what} has NaN or infinite values")
    if classifier and y.ndim != 1:
        raise ValueError(f"{what} holds arrays ({y.shape[1] if y.ndim > 1 else 0} values per "
                         "row); a classifier takes one 0-based class index per row: a numeric "
                         "column (use NNEstimator for array targets)")
    if classifier:
        ignored = y == ignore_label if ignore_label is not None else np.zeros(y.shape, bool)
        bad = ((y != np.round(y)) | (y < 0)) & ~ignored
        if bad.any():
            raise ValueError(f"{what} must hold 0-based class indices 0..K-1 (whole numbers "
                             ">= 0" + (f", or {ignore_label}, the criterion's ignore_index"
                                       if ignore_label is not None and ignore_label < 0 else "")
                             + f"); found values such as {y[bad][:3]}")
        return y.astype(np.int64)
    if integral:
        return y.astype(np.int64)
    return y.astype(float_dtype)


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


def _weights(column: pa.Array, weight_col: str, float_dtype: Any) -> np.ndarray:
    what = f"Column '{weight_col}' (weightCol)"
    w = _scalars(column, what).astype(np.float64)
    if not np.isfinite(w).all() or (w < 0).any():
        bad = w[~np.isfinite(w) | (w < 0)][:3]
        raise ValueError(f"{what} must hold finite weights >= 0; found {bad}")
    return w.astype(float_dtype)


@dataclass(frozen=True)
class BlockConverter:
    """Turns the Arrow batches of a DataFrame selected by :func:`frame_blocks` into
    :class:`~sparkdl.data.records.ArrayBlock` s (in the Python workers; picklable)."""

    sources: tuple[FeatureSource, ...]
    label_col: str
    classifier: bool
    feature_shape: tuple[int, ...]
    preprocess: Any
    float_dtype: str
    weight_col: str = ""
    class_index_labels: bool = False    # integer label columns stay int64 (a class-index loss)
    ignore_label: int | None = None     # the criterion's ignore_index, allowed as a label

    def blocks(self, batches: Iterator[pa.RecordBatch]) -> Iterator[ArrayBlock]:
        """One block per Arrow slice; a slice with bad values gives a block carrying the
        error (raised on the driver with every partition's problems)."""
        inputs, dtype = len(self.sources), np.dtype(self.float_dtype)
        label_at = inputs + (1 if self.weight_col else 0)
        for whole in batches:
            for batch in _slices(whole, _BLOCK_BYTES):
                try:
                    xs = arrow_inputs(batch.columns[:inputs], self.sources,
                                      list(self.feature_shape), self.preprocess, dtype)
                    if self.weight_col:
                        xs.append(_weights(batch.column(inputs), self.weight_col, dtype))
                    yield ArrayBlock(xs, _labels(batch.column(label_at), self.label_col,
                                                 self.classifier, dtype,
                                                 self.class_index_labels, self.ignore_label))
                except ValueError as exc:
                    yield ArrayBlock([], np.zeros(0), error=str(exc))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow`` form: every block pickled into a one-row ``block binary`` batch."""
        for block in self.blocks(batches):
            payload = pickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL)
            yield pa.RecordBatch.from_arrays([pa.array([payload], pa.binary())], ["block"])


@dataclass(frozen=True)
class DataFrameBlocks:
    """Training (or validation) data as a DataFrame: ``selected`` holds the model's input
    columns (and label, weight) in the partitions training uses; ``converter`` turns its Arrow
    batches into blocks where the tasks run. A classic session trains on :meth:`to_rdd`; a
    Spark Connect session, which has no RDDs, runs the DataFrame runner over ``selected``."""

    selected: Any
    converter: BlockConverter
    num_partitions: int

    def getNumPartitions(self) -> int:
        """The number of partitions (named like ``RDD.getNumPartitions``)."""
        return self.num_partitions

    @property
    def spark(self) -> Any:
        return self.selected.sparkSession

    def to_rdd(self) -> Any:
        """The blocks as an RDD (classic sessions only)."""
        blocks = self.selected.mapInArrow(self.converter, "block binary")
        return blocks.rdd.map(lambda row: pickle.loads(row[0]))


def frame_blocks(df: Any, sources: Sequence[FeatureSource], label_col: str, classifier: bool,
                 feature_shape: Sequence[int], preprocess: Any, partitions: int,
                 float_dtype: Any = np.float32, weight_col: str = "",
                 class_index_labels: bool = False, ignore_label: int | None = None
                 ) -> DataFrameBlocks:
    """The rows of ``df`` as :class:`DataFrameBlocks` in ``partitions`` partitions (``df``'s own
    when it has that many, else a round-robin repartition); with ``weight_col`` every block's
    last feature array is the rows' weights. Labels: class indices as int64 (a classifier's,
    which may also equal ``ignore_label``; with ``class_index_labels`` an integer column's),
    anything else in ``float_dtype``."""
    from pyspark.sql import functions as F

    from .dataframe_partitions import partition_count

    float_dtype = np.dtype(float_dtype)
    float_type = "double" if float_dtype == np.float64 else "float"
    weights = [F.col(weight_col).cast("double").alias("_sparkdl_weight")] if weight_col else []
    selected = df.select(*input_expressions(sources, float_type), *weights,
                         F.col(label_col).alias(LABEL_FIELD))
    count = partition_count(selected)
    if partitions and partitions != count:
        selected, count = selected.repartition(partitions), partitions
    converter = BlockConverter(tuple(sources), label_col, classifier, tuple(feature_shape),
                               preprocess, float_dtype.str, weight_col, class_index_labels,
                               ignore_label)
    return DataFrameBlocks(selected, converter, count)


def to_blocks(df: Any, sources: Sequence[FeatureSource], label_col: str, classifier: bool,
              feature_shape: Sequence[int], preprocess: Any, partitions: int,
              float_dtype: Any = np.float32, weight_col: str = "") -> Any:
    """The rows of ``df`` as an RDD of ArrayBlocks, one per Arrow batch, in ``partitions``
    (classic sessions; see :func:`frame_blocks`)."""
    return frame_blocks(df, sources, label_col, classifier, feature_shape, preprocess,
                        partitions, float_dtype, weight_col).to_rdd()


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
    table = pa.table({features_col: column.cast(pa.list_(pa.float32())),
                      label_col: pa.array(labels)})
    return dataframe_from_arrow(spark, table)
