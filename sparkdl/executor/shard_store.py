"""Training data held on the executors as contiguous arrays, built once per partition
(executor side).

A PySpark task over a cached RDD gets its whole partition re-sent from the JVM each time. The
engine instead converts every partition once into contiguous numpy arrays
(:mod:`sparkdl.data.records`) and keeps them where the task ran, in one of two places:

* ``"disk"`` (the default): ``.npy`` files under the executor's per-application work directory
  (``<SparkFiles root>/sparkdl-shards/<data key>``, directories ``0700``, files ``0600``), reached
  in later iterations through a per-Python-worker cache of memory-mapped arrays
  (:mod:`sparkdl.executor.worker_cache`). Python workers of the same executor share the files (and
  the page cache). A cleanup job deletes them when training ends; a run that is killed leaves
  them to the cluster manager, which deletes the application's directory on YARN and Kubernetes
  (a standalone worker keeps it until ``spark.worker.cleanup.enabled`` removes it).
* ``"memory"`` (chosen by the driver when ``spark.io.encryption.enabled`` is set, so that no
  training data reaches an executor's disk in plaintext): the arrays live only in the memory of
  the Python worker that built them; nothing is written, nothing outlives the worker.

Correctness never depends on either: :func:`open_shard` returns ``None`` when the shard is not
where the task runs (a new executor, another Python worker, a deleted directory), and the driver
has that partition's shard built where the task ran (a fill job over the partition's lineage)
and sums the iteration in partition order as usual, so the result is unchanged.

Example::

    summary = build_shard(data_key, partition, records, "float32")   # in the build job
    shard = open_shard(data_key, partition)                           # in a later task, or None
    features, labels = shard.take(shard.permutation(seed, epoch, partition, True)[:32])
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..data.batch_plan import local_permutation
from ..errors import permanent_report
from ..data.ragged import Ragged
from ..data.records import convert_records
from .executor_identity import executor_location
from .worker_cache import WorkerCache

__all__ = ["SHARD_PLACES", "Shard", "ShardSummary", "summarize_arrays", "build_shard", "open_shard", "drop_run",
           "shard_root"]

log = logging.getLogger(__name__)

_SAMPLE_RECORDS = 4

# (data key, partition) -> Shard; memory maps or arrays are few objects: nothing needs freezing.
# An evicted shard is only a placement miss: the driver has it built again where it is needed.
_SHARDS: WorkerCache["Shard"] = WorkerCache(capacity=256, freeze=False)


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
    nbytes: int = 0             # the shard's arrays, as held (disk files or worker memory)
    executor: str = ""          # where it was built, "executor_<host>_<id>" ("" if unknown:
    # sparkdl.executor.executor_identity)
    error: str | None = None
    content_hash: str = ""      # of the partition's arrays: a rebuild must reproduce it
    fatal: tuple[str, str] | None = None   # a permanent sparkdl error (class name, message)
    # met while building: the driver raises it (sparkdl.errors.permanent_report)


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

    def take(self, indices: np.ndarray) -> tuple[list[Any], np.ndarray]:
        """Features and labels of the given local indices, as new in-memory arrays
        (:class:`~sparkdl.data.ragged.Ragged` for variable-length inputs)."""
        return ([f.take(indices) if isinstance(f, Ragged) else np.asarray(f[indices])
                 for f in self.features], np.asarray(self.labels[indices]))


def shard_root() -> str:
    """The directory under which this executor keeps shards (its Spark work directory)."""
    try:
        from pyspark.files import SparkFiles

        if SparkFiles._is_running_on_worker:  # type: ignore[attr-defined]
            return os.path.abspath(os.path.join(SparkFiles.getRootDirectory(), "sparkdl-shards"))
    except Exception:  # pragma: no cover - outside Spark
        pass
    global _PRIVATE_ROOT
    if _PRIVATE_ROOT is None:   # outside Spark: a private directory of this process
        _PRIVATE_ROOT = tempfile.mkdtemp(prefix="sparkdl-shards-")
    return _PRIVATE_ROOT


_PRIVATE_ROOT: str | None = None


def _shard_dir(data_key: str, partition: int) -> str:
    return os.path.join(shard_root(), data_key, f"part-{partition:05d}")


def _private_dirs(path: str) -> None:
    """``path`` and its missing parents, readable by this user only (whatever the umask)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        os.chmod(d, 0o700)


def _save_arrays(target: str, features: list[np.ndarray], labels: np.ndarray) -> None:
    parent = os.path.dirname(target)
    _private_dirs(parent)
    tmp = os.path.join(parent, f".tmp-{uuid.uuid4().hex}")
    os.mkdir(tmp, 0o700)
    os.chmod(tmp, 0o700)
    arrays: dict[str, np.ndarray] = {}
    for k, f in enumerate(features):
        if isinstance(f, Ragged):
            arrays[f"x{k}.values.npy"], arrays[f"x{k}.offsets.npy"] = f.values, f.offsets
        else:
            arrays[f"x{k}.npy"] = f
    arrays["y.npy"] = labels
    for name, array in arrays.items():
        fd = os.open(os.path.join(tmp, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            np.save(out, array)
    if os.path.isdir(target):
        shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def _load_arrays(directory: str) -> Shard:
    names = set(os.listdir(directory))
    feats: list[Any] = []

    def load(name: str) -> np.ndarray:
        return np.load(os.path.join(directory, name), mmap_mode="r")

    while True:
        k = len(feats)
        if f"x{k}.npy" in names:
            feats.append(load(f"x{k}.npy"))
        elif f"x{k}.values.npy" in names:
            feats.append(Ragged(load(f"x{k}.values.npy"), np.array(load(f"x{k}.offsets.npy"))))
        else:
            break
    return Shard(feats, load("y.npy"))


def summarize_arrays(partition: int, features: list[np.ndarray], labels: np.ndarray
                     ) -> ShardSummary:
    """What the driver needs to know about one partition's arrays (sizes, kinds, a few
    samples, NaNs), without the arrays themselves."""
    summary = ShardSummary(partition=partition, count=int(labels.shape[0]))
    digest = hashlib.sha1()
    flat: list[np.ndarray] = []
    for f in [*features, labels]:
        flat.extend([f.values, f.offsets] if isinstance(f, Ragged) else [f])
    for array in flat:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).data)
    summary.content_hash = digest.hexdigest()
    summary.nbytes = int(sum(array.nbytes for array in flat))
    if not summary.count:
        return summary
    summary.feature_shapes = [(-1,) if isinstance(f, Ragged) else tuple(f.shape[1:])
                              for f in features]
    summary.feature_dtypes = [f.dtype.str for f in features]
    summary.label_shape = tuple(labels.shape[1:])
    summary.label_dtype = labels.dtype.str
    if labels.dtype.kind == "f":
        summary.label_nan = bool(np.isnan(labels).any())
    finite = labels[np.isfinite(labels)] if labels.dtype.kind == "f" else labels
    if finite.size:
        summary.label_min = float(finite.min())
        summary.label_max = float(finite.max())
    summary.feature_nan = any(
        f.dtype.kind == "f" and not np.isfinite(f.values if isinstance(f, Ragged) else f).all()
        for f in features)
    first = np.arange(min(_SAMPLE_RECORDS, summary.count))
    summary.sample_features = [f.take(first) if isinstance(f, Ragged)
                               else np.array(f[:_SAMPLE_RECORDS]) for f in features]
    summary.sample_labels = np.array(labels[:_SAMPLE_RECORDS])
    return summary


SHARD_PLACES = ("disk", "memory")


def build_shard(data_key: str, partition: int, records: Iterable[Any],
                float_dtype: str, place: str = "disk", ragged: tuple[int, ...] = ()
                ) -> ShardSummary:
    """Convert one partition into arrays, keep them where this task runs (``place``: "disk" or
    "memory", see the module docstring), and summarise them.

    Never raises for bad data: the problem is returned in ``ShardSummary.error`` so the driver
    can raise one clear error before training starts; a permanent sparkdl error (raised by the
    records' source, e.g. the user's map function) is returned in ``ShardSummary.fatal`` too,
    so that Spark does not retry the task and the driver raises that very error.
    """
    records = iter(records)
    try:
        feats, labels = convert_records(partition, records, np.dtype(float_dtype), ragged)
    except Exception as exc:
        fatal = permanent_report(exc)
        if fatal is None and not isinstance(exc, (TypeError, ValueError)):
            raise
        try:
            for _ in records:  # drain the input so that this Python worker can be reused
                pass
        except Exception:      # a later record fails too: this worker is just not reused
            pass
        return ShardSummary(partition=partition, error=str(exc), fatal=fatal)
    summary = summarize_arrays(partition, feats, labels)
    summary.executor = executor_location()
    if place == "memory":
        _SHARDS.put((data_key, partition), Shard(feats, labels))
        return summary
    summary.executor_dir = shard_root()
    directory = _shard_dir(data_key, partition)
    _save_arrays(directory, feats, labels)
    _SHARDS.put((data_key, partition), _load_arrays(directory))
    return summary


def open_shard(data_key: str, partition: int) -> Shard | None:
    """This worker's shard of ``partition``, from memory or from the executor's files, or None."""
    shard = _SHARDS.get((data_key, partition))
    if shard is not None:
        return shard
    directory = _shard_dir(data_key, partition)
    if not os.path.isdir(directory):
        return None
    try:
        shard = _load_arrays(directory)
    except (OSError, ValueError) as exc:
        log.warning("shard %s of %s is unreadable (%s); it will be rebuilt",
                    partition, data_key, exc)
        return None
    return _SHARDS.put((data_key, partition), shard)


def drop_run(data_key: str) -> None:
    """Forget a data set's shards in this worker and delete its files on this executor."""
    for key in [k for k in _SHARDS.keys() if k[0] == data_key]:
        _SHARDS.pop(key)
    shutil.rmtree(os.path.join(shard_root(), data_key), ignore_errors=True)
