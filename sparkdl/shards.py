"""Training data held on the executors as contiguous arrays, built once per partition.

A PySpark task over a cached RDD gets its whole partition re-sent from the JVM each time. The
engine instead converts every partition once into contiguous numpy arrays (one per model input,
one for the labels), writes them as ``.npy`` files in the executor's work directory, and reaches
them in later iterations through a per-Python-worker cache of memory-mapped arrays. Python workers
of the same executor share the files (and the page cache).

This module runs on the executors. Its module-level cache must stay here (an importable module):
a dict named by a function shipped to tasks would be pickled by value into every task.

Correctness never depends on the cache: :func:`open_shard` returns ``None`` when the files are
not there (new executor, deleted directory), and the driver rebuilds the shards and re-runs the
iteration, which is deterministic.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from .batching import local_permutation

__all__ = ["ArrayBlock", "Shard", "ShardSummary", "build_shard", "open_shard", "drop_run",
           "shard_root"]

log = logging.getLogger(__name__)

_MAX_CACHED_RUNS = 8
_SAMPLE_RECORDS = 4

# run key -> {partition -> Shard}; most recently used last.
_CACHE: "OrderedDict[str, dict[int, Shard]]" = OrderedDict()


@dataclass
class ArrayBlock:
    """Many samples in one record: ``features`` (one array per model input, samples on the first
    axis) and ``labels``. An RDD of blocks is converted without a Python loop over samples (the
    DataFrame API feeds the engine this way). ``error`` reports a problem found while making the
    block, raised by the engine before training."""

    features: list[np.ndarray]
    labels: np.ndarray
    error: str | None = None


@dataclass
class ShardSummary:
    """What the driver learns about a partition from the build job (small, picklable)."""

    partition: int
    count: int = 0
    feature_shapes: list[tuple[int, ...]] = field(default_factory=list)
    feature_dtypes: list[str] = field(default_factory=list)
    label_shape: tuple[int, ...] = ()
    label_dtype: str = ""
    label_min: float | None = None
    label_max: float | None = None
    label_nan: bool = False
    feature_nan: bool = False
    sample_features: list[np.ndarray] = field(default_factory=list)
    sample_labels: np.ndarray | None = None
    executor_dir: str = ""
    error: str | None = None


class Shard:
    """One partition's samples as arrays: ``features`` (one per model input) and ``labels``."""

    def __init__(self, features: list[np.ndarray], labels: np.ndarray) -> None:
        self.features = features
        self.labels = labels
        self.count = int(labels.shape[0])
        self._perm_key: tuple[int, int, bool] | None = None
        self._perm: np.ndarray | None = None

    def permutation(self, seed: int, epoch: int, partition: int, shuffle: bool) -> np.ndarray:
        """The epoch's visiting order of this partition (cached for the current epoch)."""
        key = (seed, epoch, shuffle)
        if self._perm_key != key:
            self._perm = local_permutation(self.count, seed, epoch, partition, shuffle)
            self._perm_key = key
        assert self._perm is not None
        return self._perm

    def take(self, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Features and labels of the given local indices, as new in-memory arrays."""
        return [np.asarray(f[indices]) for f in self.features], np.asarray(self.labels[indices])


def shard_root() -> str:
    """The directory under which this executor keeps shards (its Spark work directory)."""
    try:
        from pyspark.files import SparkFiles

        if SparkFiles._is_running_on_worker:  # type: ignore[attr-defined]
            return os.path.abspath(os.path.join(SparkFiles.getRootDirectory(), "sparkdl-shards"))
    except Exception:  # pragma: no cover - outside Spark
        pass
    return os.path.join(tempfile.gettempdir(), "sparkdl-shards")


def _shard_dir(run_key: str, partition: int) -> str:
    return os.path.join(shard_root(), run_key, f"part-{partition:05d}")


def _as_numeric(value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{what} is not numeric (numpy dtype {arr.dtype}, "
                        f"Python type {type(value).__name__})")
    return arr


def _stacked(arrays: list[np.ndarray], float_dtype: np.dtype, join: Any) -> np.ndarray:
    out = join(arrays)
    if out.dtype.kind in "fb":
        return out.astype(float_dtype, copy=False)
    return out.astype(np.int64, copy=False)


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
    shapes = [tuple(f.shape[1:]) for f in blocks[0].features]
    for n, block in enumerate(blocks):
        got = [tuple(f.shape[1:]) for f in block.features]
        if got != shapes:
            raise ValueError(f"block {n} of partition {partition} has feature shape(s) {got} but "
                             f"the first block has {shapes}")
        if len({len(block.labels), *(len(f) for f in block.features)}) != 1:
            raise ValueError(f"block {n} of partition {partition} has features and labels of "
                             "different lengths")
    feats = [_stacked([b.features[k] for b in blocks], float_dtype, np.concatenate)
             for k in range(len(shapes))]
    return feats, _stacked([b.labels for b in blocks], float_dtype, np.concatenate)


def _convert_records(partition: int, records: Iterator[Any], float_dtype: np.dtype
                     ) -> tuple[list[np.ndarray], np.ndarray]:
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
    return ([_stacked(f, float_dtype, np.stack) for f in feats],
            _stacked(labels, float_dtype, np.stack))


def _save_arrays(target: str, features: list[np.ndarray], labels: np.ndarray) -> None:
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    for k, f in enumerate(features):
        np.save(os.path.join(tmp, f"x{k}.npy"), f)
    np.save(os.path.join(tmp, "y.npy"), labels)
    if os.path.isdir(target):
        shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def _load_arrays(directory: str) -> Shard:
    names = sorted((n for n in os.listdir(directory) if n.startswith("x")),
                   key=lambda n: int(n[1:-4]))
    feats = [np.load(os.path.join(directory, n), mmap_mode="r") for n in names]
    labels = np.load(os.path.join(directory, "y.npy"), mmap_mode="r")
    return Shard(feats, labels)


def _remember(run_key: str, partition: int, shard: Shard) -> None:
    runs = _CACHE.setdefault(run_key, {})
    runs[partition] = shard
    _CACHE.move_to_end(run_key)
    while len(_CACHE) > _MAX_CACHED_RUNS:
        _CACHE.popitem(last=False)


def build_shard(run_key: str, partition: int, records: Iterable[Any],
                float_dtype: str) -> ShardSummary:
    """Convert one partition into arrays, store them on this executor, and summarise them.

    Never raises for bad data: the problem is returned in ``ShardSummary.error`` so the driver
    can raise one clear error before training starts.
    """
    summary = ShardSummary(partition=partition)
    records = iter(records)
    try:
        feats, labels = _convert_records(partition, records, np.dtype(float_dtype))
    except (TypeError, ValueError) as exc:
        summary.error = str(exc)
        for _ in records:  # drain the input so that this Python worker can be reused
            pass
        return summary
    summary.count = int(labels.shape[0])
    summary.executor_dir = shard_root()
    if summary.count:
        summary.feature_shapes = [tuple(f.shape[1:]) for f in feats]
        summary.feature_dtypes = [f.dtype.str for f in feats]
        summary.label_shape = tuple(labels.shape[1:])
        summary.label_dtype = labels.dtype.str
        if labels.dtype.kind == "f":
            summary.label_nan = bool(np.isnan(labels).any())
        finite = labels[np.isfinite(labels)] if labels.dtype.kind == "f" else labels
        if finite.size:
            summary.label_min = float(finite.min())
            summary.label_max = float(finite.max())
        summary.feature_nan = any(f.dtype.kind == "f" and not np.isfinite(f).all() for f in feats)
        summary.sample_features = [np.array(f[:_SAMPLE_RECORDS]) for f in feats]
        summary.sample_labels = np.array(labels[:_SAMPLE_RECORDS])
    directory = _shard_dir(run_key, partition)
    _save_arrays(directory, feats, labels)
    _remember(run_key, partition, _load_arrays(directory))
    return summary


def open_shard(run_key: str, partition: int) -> Shard | None:
    """This worker's shard of ``partition``, from memory or from the executor's files, or None."""
    shard = _CACHE.get(run_key, {}).get(partition)
    if shard is not None:
        _CACHE.move_to_end(run_key)
        return shard
    directory = _shard_dir(run_key, partition)
    if not os.path.isdir(directory):
        return None
    try:
        shard = _load_arrays(directory)
    except (OSError, ValueError) as exc:
        log.warning("shard %s of run %s is unreadable (%s); it will be rebuilt",
                    partition, run_key, exc)
        return None
    _remember(run_key, partition, shard)
    return shard


def drop_run(run_key: str) -> None:
    """Forget a run's shards in this worker and delete its files on this executor."""
    _CACHE.pop(run_key, None)
    shutil.rmtree(os.path.join(shard_root(), run_key), ignore_errors=True)
