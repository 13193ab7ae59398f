"""A partition's records as contiguous arrays: the conversion every shard starts with.

Training data reaches the engine as an iterator of records per partition: ``(features, label)``
pairs (features a numpy array, or a tuple of arrays for a multi-input model) or
:class:`ArrayBlock` s of many samples (what the DataFrame API produces). :func:`convert_records`
turns them into one array per model input plus one for the labels; floating values take the
given float dtype, integers become int64. Inputs named in ``ragged`` are variable-length 1-D
arrays, kept as :class:`~sparkdl.data.ragged.Ragged` (values plus offsets, no padding). Bad
records raise ``TypeError`` / ``ValueError`` naming the record and the partition. Used on the executors (shard building) and by the in-process runner.

Example::

    features, labels = convert_records(0, iter([(np.ones(3), 1), (np.zeros(3), 0)]),
                                       np.dtype("float32"))
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .ragged import Ragged

__all__ = ["ArrayBlock", "convert_records", "numeric_kind", "mixed_kinds_message"]


@dataclass
class ArrayBlock:
    """Many samples in one record: ``features`` (one array per model input, samples on the first
    axis) and ``labels``. An RDD of blocks is converted without a Python loop over samples (the
    DataFrame API feeds the engine this way). ``error`` reports a problem found while making the
    block, raised by the engine before training."""

    features: list[np.ndarray]
    labels: np.ndarray
    error: str | None = None


def _as_numeric(value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{what} is not numeric (numpy dtype {arr.dtype}, "
                        f"Python type {type(value).__name__})")
    return arr


def _target_dtype(dtype: np.dtype, float_dtype: np.dtype) -> np.dtype:
    return float_dtype if dtype.kind in "fb" else np.dtype(np.int64)


def numeric_kind(dtype: np.dtype) -> str:
    """``"int"`` (kept as int64: ids, class indices) or ``"float"`` (the model's float dtype;
    bools too): the kind a value keeps through :func:`convert_records`. Every record of a data
    set must have the same kind per input and for the label, within a partition and across
    partitions alike (numpy would silently turn a partition's ints into floats)."""
    return "int" if np.dtype(dtype).kind in "iu" else "float"


def mixed_kinds_message(what: str, first: str, first_kind: str, other: str,
                        other_kind: str) -> str:
    """The one message for ``what`` (``"labels"``, ``"features"``, ``"input 1 of the
    features"``) of two kinds, wherever the two records are (the engine says whose data:
    "The training RDD mixes ...")."""
    return (f"mixes int and float {what}: {first} has {first_kind} {what} but "
            f"{other} has {other_kind} {what}. Make every record's {what} the same kind (all "
            "float or all int: ids and class indices are ints).")


def _stacked(arrays: list[Any], float_dtype: np.dtype, join: Any) -> Any:
    if arrays and isinstance(arrays[0], Ragged):
        out = Ragged.concatenate(arrays)
        return out.astype(_target_dtype(out.dtype, float_dtype))
    out = join(arrays)
    return out.astype(_target_dtype(out.dtype, float_dtype), copy=False)


def _shape(f: Any) -> tuple[int, ...]:
    return (-1,) if isinstance(f, Ragged) else tuple(f.shape[1:])


def _convert_blocks(partition: int, first: ArrayBlock, records: Iterator[Any],
                    float_dtype: np.dtype) -> tuple[list[np.ndarray], np.ndarray]:
    blocks = [first]
    for n, block in enumerate(records, start=1):
        if not isinstance(block, ArrayBlock):
            raise TypeError(f"record {n} of partition {partition} is a {type(block).__name__} "
                            "among ArrayBlocks")
        blocks.append(block)
    for block in blocks:
        if block.error:
            raise ValueError(block.error)
    blocks = [b for b in blocks if len(b.labels)]
    if not blocks:
        return [], np.zeros(0, dtype=np.int64)
    shapes = [_shape(f) for f in blocks[0].features]
    kinds = [numeric_kind(f.dtype) for f in blocks[0].features]
    label_kind = numeric_kind(blocks[0].labels.dtype)
    for n, block in enumerate(blocks):
        for k, f in enumerate(block.features[:len(kinds)]):
            if numeric_kind(f.dtype) != kinds[k]:
                raise ValueError(mixed_kinds_message(
                    "features" if len(kinds) == 1 else f"input {k} of the features",
                    f"block 0 of partition {partition}", kinds[k],
                    f"block {n}", numeric_kind(f.dtype)))
        if numeric_kind(block.labels.dtype) != label_kind:
            raise ValueError(mixed_kinds_message("labels", f"block 0 of partition {partition}",
                                                 label_kind, f"block {n}",
                                                 numeric_kind(block.labels.dtype)))
        got = [_shape(f) for f in block.features]
        if got != shapes:
            raise ValueError(f"block {n} of partition {partition} has feature shape(s) {got} but "
                             f"the first block has {shapes}")
        if len({len(block.labels), *(len(f) for f in block.features)}) != 1:
            raise ValueError(f"block {n} of partition {partition} has features and labels of "
                             "different lengths")
    feats = [_stacked([b.features[k] for b in blocks], float_dtype, np.concatenate)
             for k in range(len(shapes))]
    return feats, _stacked([b.labels for b in blocks], float_dtype, np.concatenate)


def convert_records(partition: int, records: Iterator[Any], float_dtype: np.dtype,
                    ragged: tuple[int, ...] = ()) -> tuple[list[Any], np.ndarray]:
    records = iter(records)
    first_record = next(records, None)
    if first_record is None:
        return [], np.zeros(0, dtype=np.int64)
    if isinstance(first_record, ArrayBlock):
        return _convert_blocks(partition, first_record, records, float_dtype)
    records = itertools.chain([first_record], records)
    feats: list[list[np.ndarray]] | None = None
    labels: list[np.ndarray] = []
    first_shapes: list[tuple[int, ...]] = []
    first_kinds: list[str] = []
    first_label_shape: tuple[int, ...] = ()
    first_label_kind = ""
    multi_input = False
    for n, record in enumerate(records):
        where = f"record {n} of partition {partition}"
        if not isinstance(record, (tuple, list)) or len(record) != 2:
            raise TypeError(f"{where} is not a (features, label) pair: got "
                            f"{type(record).__name__}")
        x, y = record
        inputs = list(x) if isinstance(x, tuple) else [x]
        arrays = [_as_numeric(v, f"the features of {where}" + (f" (input {k})" if
                                                                 isinstance(x, tuple) else ""))
                  for k, v in enumerate(inputs)]
        label = _as_numeric(y, f"the label of {where}")
        if feats is None:
            multi_input = isinstance(x, tuple)
            feats = [[] for _ in arrays]
            first_shapes = [a.shape for a in arrays]
            first_kinds = [numeric_kind(a.dtype) for a in arrays]
            first_label_shape = label.shape
            first_label_kind = numeric_kind(label.dtype)
        if isinstance(x, tuple) != multi_input or len(arrays) != len(feats):
            raise ValueError(f"{where} has {len(arrays)} feature input(s) but the first record "
                             f"of the partition has {len(feats)}")
        for k, a in enumerate(arrays):
            if numeric_kind(a.dtype) != first_kinds[k]:
                raise ValueError(mixed_kinds_message(
                    f"input {k} of the features" if multi_input else "features",
                    f"record 0 of partition {partition}", first_kinds[k], where,
                    numeric_kind(a.dtype)))
            if k in ragged:
                if a.ndim != 1:
                    raise ValueError(f"{where} has a {a.ndim}-d array for input {k}, which is "
                                     "variable-length: give a 1-d array per record")
                feats[k].append(a)
                continue
            if a.shape != first_shapes[k]:
                raise ValueError(f"{where} has feature shape {a.shape}"
                                 + (f" for input {k}" if multi_input else "")
                                 + f" but the first record of the partition has {first_shapes[k]}")
            feats[k].append(a)
        if numeric_kind(label.dtype) != first_label_kind:
            raise ValueError(mixed_kinds_message("labels", f"record 0 of partition {partition}",
                                                 first_label_kind, where,
                                                 numeric_kind(label.dtype)))
        if label.shape != first_label_shape:
            raise ValueError(f"{where} has label shape {label.shape} but the first record of "
                             f"the partition has {first_label_shape}")
        labels.append(label)
    if feats is None:
        return [], np.zeros(0, dtype=np.int64)
    if any(k >= len(feats) for k in ragged):
        raise ValueError(f"partition {partition}: variable-length input(s) {list(ragged)} but "
                         f"its records have {len(feats)} input(s)")
    return ([_stacked([Ragged.from_rows(f)], float_dtype, None) if k in ragged
             else _stacked(f, float_dtype, np.stack) for k, f in enumerate(feats)],
            _stacked(labels, float_dtype, np.stack))
