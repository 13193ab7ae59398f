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

__all__ = ["ArrayBlock", "convert_records"]


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
    for n, block in enumerate(blocks):
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
    first_label_shape: tuple[int, ...] = ()
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
            first_label_shape = label.shape
        if isinstance(x, tuple) != multi_input or len(arrays) != len(feats):
            raise ValueError(f"{where} has {len(arrays)} feature input(s) but the first record "
                             f"of the partition has {len(feats)}")
        for k, a in enumerate(arrays):
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
