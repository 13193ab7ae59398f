"""What a fit saw of its input columns, and ``transform``'s check of a DataFrame against it.

A fitted model keeps one :class:`FittedInput` per model input (saved in its metadata, so a
loaded model checks too): the column(s), their Spark type, whether the values were kept as
int64 ids, and the values per row the model was trained on. ``transform`` then

* refuses, before any Spark job, a DataFrame whose inputs differ in number, in rank (a scalar
  column for an array one), in kind (image or not) or in the values per row where the schema
  says them (``featuresCols``, Vector columns with ML attributes, e.g. a ``VectorAssembler``'s),
  and float values for int64 ids (:func:`check_transform_inputs`);
* casts integer values to the model's float dtype where the fit took floats, as the fit itself
  casts every floating input;
* checks the values per row of array and Vector columns where the schema does not say them:
  on the first row, before the transform's job (:func:`check_first_row_widths`), and on every
  row in the tasks, before the model runs (:func:`check_widths`).

Models saved before the record existed have none, and transform as before.

Example::

    record = fitted_inputs(sources, schema, data_spec.feature_shapes, preprocess is None)
    sources = check_transform_inputs(record, feature_sources(df.schema, ...), df.schema)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from ..errors import InvalidArgumentError
from .dataframe_arrays import FeatureSource

__all__ = ["FittedInput", "fitted_inputs", "record_from_json", "check_transform_inputs",
           "check_first_row_widths", "check_widths"]


@dataclass(frozen=True)
class FittedInput:
    """One model input as the fit saw it: ``width`` the values per row (None: not recorded,
    e.g. under ``preprocess``, or variable-length)."""

    columns: tuple[str, ...]
    kind: str
    integral: bool
    spark_type: str
    width: int | None

    @property
    def name(self) -> str:
        return self.columns[0] if len(self.columns) == 1 else str(list(self.columns))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["columns"] = list(self.columns)
        return out


def _spark_type(schema: Any, source: FeatureSource) -> str:
    if source.kind == "columns":
        return ", ".join(schema[c].dataType.simpleString() for c in source.columns)
    return schema[source.columns[0]].dataType.simpleString()


def fitted_inputs(sources: Sequence[FeatureSource], schema: Any,
                  feature_shapes: Sequence[tuple[int, ...]], widths_known: bool
                  ) -> list[FittedInput]:
    """The record of a fit's inputs: ``feature_shapes`` are the stored shapes of the inputs
    (the build's, after ``featureShape``, which keeps the count; ``widths_known`` False when a
    ``preprocess`` may have changed them)."""
    out = []
    for k, s in enumerate(sources):
        shape = tuple(feature_shapes[k]) if k < len(feature_shapes) else None
        width = None
        if widths_known and shape is not None and not s.ragged and s.kind != "scalar":
            width = int(np.prod(shape))
        out.append(FittedInput(tuple(s.columns), s.kind, s.integral, _spark_type(schema, s),
                               width))
    return out


def record_from_json(data: Any) -> list[FittedInput] | None:
    """The record read back from a saved model's metadata (None: saved before records)."""
    if not data:
        return None
    return [FittedInput(tuple(d["columns"]), d["kind"], bool(d["integral"]), d["spark_type"],
                        d.get("width")) for d in data]


def _schema_width(schema: Any, source: FeatureSource) -> int | None:
    """Values per row the schema says: a ``featuresCols`` list, a Vector with ML attributes."""
    if source.kind == "columns":
        return len(source.columns)
    if source.kind == "vector":
        attrs = schema[source.columns[0]].metadata.get("ml_attr", {})
        if "num_attrs" in attrs:
            return int(attrs["num_attrs"])
    return None


def _refuse(new: FeatureSource, schema: Any, fitted: FittedInput, problem: str
            ) -> InvalidArgumentError:
    what = "Columns" if new.kind == "columns" else "Column"
    return InvalidArgumentError(
        f"{what} '{new.name}' ({_spark_type(schema, new)}) does not fit the model: {problem} "
        f"(the model was fitted on {fitted.kind} column '{fitted.name}' of type "
        f"{fitted.spark_type}).")


def check_transform_inputs(record: Sequence[FittedInput] | None,
                           sources: Sequence[FeatureSource], schema: Any
                           ) -> list[FeatureSource]:
    """``transform``'s inputs (``sources``, from its DataFrame's ``schema``) checked against
    what the fit saw (``record``; None: no check), before any Spark job; integer columns the
    fit saw as floats are returned as float sources (cast, as the fit did)."""
    sources = list(sources)
    if record is None:
        return sources
    if len(sources) != len(record):
        raise InvalidArgumentError(
            f"transform has {len(sources)} model input(s) ({[s.name for s in sources]}) but "
            f"the model was fitted on {len(record)} ({[f.name for f in record]}): set the "
            "same featuresCol / featuresCols / inputCols as the fit.")
    out = []
    for new, fitted in zip(sources, record):
        if (new.kind == "scalar") != (fitted.kind == "scalar"):
            raise _refuse(new, schema, fitted, f"it is a {new.kind} column")
        if (new.kind == "image") != (fitted.kind == "image"):
            raise _refuse(new, schema, fitted, f"it is a{'n' if new.kind[0] in 'aeiou' else ''} "
                                               f"{new.kind} column")
        if fitted.integral and not new.integral:
            raise _refuse(new, schema, fitted,
                          "it holds floating values where the fit took integer ids (kept as "
                          "int64); cast it to an integer type")
        width = _schema_width(schema, new)
        if fitted.width is not None and width is not None and width != fitted.width:
            raise _refuse(new, schema, fitted, f"it has {width} values per row; the model was "
                                               f"fitted on {fitted.width}")
        if new.integral and not fitted.integral:
            new = replace(new, integral=False)          # to the model's float dtype
        out.append(new)
    return out


def check_first_row_widths(dataset: Any, record: Sequence[FittedInput] | None,
                           sources: Sequence[FeatureSource]) -> None:
    """``transform``'s array and Vector inputs whose values per row the schema does not say,
    checked against the fit on the first row that has them all (one small job, before the
    transform's own), so that a DataFrame of other rows is refused here, with the column named,
    not inside a task. Rows that differ further on are still refused in the tasks
    (:func:`check_widths`)."""
    if record is None:
        return
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    probed = [(new, fitted) for new, fitted in zip(sources, record)
              if fitted.width is not None and not new.ragged and new.kind in ("array", "vector")
              and _schema_width(dataset.schema, new) is None]
    if not probed:
        return
    sizes = [F.size(vector_to_array(F.col(new.columns[0])) if new.kind == "vector"
                    else F.col(new.columns[0])).alias(f"_w{k}")
             for k, (new, _) in enumerate(probed)]
    present = [F.col(new.columns[0]).isNotNull() for new, _ in probed]
    condition = present[0]
    for more in present[1:]:
        condition = condition & more
    rows = dataset.where(condition).select(*sizes).limit(1).collect()
    if not rows:
        return
    for k, (new, fitted) in enumerate(probed):
        width = int(rows[0][k])
        if width != fitted.width:
            raise _refuse(new, dataset.schema, fitted, f"it has {width} values per row (the "
                                                       "first row read); the model was fitted "
                                                       f"on {fitted.width}")


def _row_widths(column: Any, source: FeatureSource) -> np.ndarray | None:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if source.kind == "image":
        return (np.asarray(column.field("height").to_numpy(zero_copy_only=False), np.int64)
                * column.field("width").to_numpy(zero_copy_only=False)
                * column.field("nChannels").to_numpy(zero_copy_only=False))
    if isinstance(column.type, (pa.ListType, pa.LargeListType)):
        return np.diff(np.asarray(column.offsets))
    return None


def check_widths(columns: Sequence[Any], sources: Sequence[FeatureSource],
                 widths: Sequence[int | None]) -> None:
    """In a ``transform`` task: every row of every input has the values per row the model
    was fitted on (``widths``, None: unchecked), before the model runs."""
    for column, source, width in zip(columns, sources, widths):
        if width is None or source.ragged:
            continue
        got = _row_widths(column, source)
        if got is None or not len(got):
            continue
        if column.null_count:           # null rows: the conversion's own error names them
            got = np.where(np.asarray(column.is_valid()), got, width)
        bad = np.flatnonzero(got != width)
        if len(bad):
            raise InvalidArgumentError(
                f"Column '{source.name}' has {int(got[bad[0]])} values per row; the model was "
                f"fitted on {width} (row {int(bad[0])} of an Arrow batch of transform's "
                "input).")
