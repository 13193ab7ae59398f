"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (IDX files; no downloads).

Example::

    from sparkdl.datasets import load_fashion_mnist
    train_x, train_y, test_x, test_y = load_fashion_mnist(standardize=True)
"""

from __future__ import annotations

import gzip
import os
from typing import Any

import numpy as np

__all__ = ["read_idx", "load_fashion_mnist", "fashion_mnist_rdd", "FASHION_MNIST_DIR",
           "FASHION_MNIST_MEAN", "FASHION_MNIST_STD", "FASHION_MNIST_CLASSES"]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_MEAN = 0.2860
"""Mean pixel value of the training images scaled to [0, 1]."""
FASHION_MNIST_STD = 0.3530
"""Standard deviation of the training pixels scaled to [0, 1]."""
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot"]
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (as used by MNIST and Fashion-MNIST), gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim)]
    dtype = np.dtype(_IDX_TYPES[data[2]])
    array = np.frombuffer(data, dtype=dtype, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} but holds {array.size} values")
    return array.reshape(dims).astype(dtype.newbyteorder("="), copy=False)


def _idx_paths(data_dir: str) -> list[str]:
    """The four IDX files' paths (gzipped or not) in ``data_dir``: train images, train labels,
    test images, test labels."""
    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    paths = []
    for name in names:
        for candidate in (name + ".gz", name):
            if os.path.exists(os.path.join(data_dir, candidate)):
                paths.append(os.path.join(data_dir, candidate))
                break
        else:
            raise FileNotFoundError(
                f"Fashion-MNIST file {name}(.gz) not found in {data_dir}. Install it with "
                "'apt-get install dataset-fashion-mnist' (files under "
                f"{FASHION_MNIST_DIR}) or pass the directory holding the IDX files.")
    return paths


def _idx_length(path: str) -> int:
    """The first dimension of an IDX file, from its header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        header = f.read(8)
    return int.from_bytes(header[4:8], "big")


def _images(a: np.ndarray, standardize: bool) -> np.ndarray:
    x = (a.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return (x - FASHION_MNIST_MEAN) / FASHION_MNIST_STD if standardize else x


def _read_slice(images_path: str, labels_path: str, samples: int, partitions: int,
                standardize: bool, index: int) -> list[tuple[np.ndarray, np.int64]]:
    """The ``index``-th of ``partitions`` contiguous slices of the first ``samples`` samples,
    read from the files by the task itself."""
    lo, hi = index * samples // partitions, (index + 1) * samples // partitions
    x = _images(read_idx(images_path)[lo:hi], standardize)
    y = read_idx(labels_path)[lo:hi].astype(np.int64)
    return list(zip(x, y))


def fashion_mnist_rdd(sc: Any, split: str = "train", partitions: int = 0,
                      data_dir: str = FASHION_MNIST_DIR, standardize: bool = False,
                      samples: int = 0) -> Any:
    """Fashion-MNIST as an RDD of ``(image (1, 28, 28) float32, label int64)`` pairs, read
    from the IDX files by the tasks: nothing but the path travels from the driver, as with
    ``sc.textFile``, so ``data_dir`` must be readable where the executors run (any path on a
    local master; a shared file system on a cluster).

    ``split``: ``"train"`` (60,000 in Fashion-MNIST) or ``"test"`` (10,000); ``partitions``
    contiguous slices (0: ``sc.defaultParallelism``); ``samples``: the first ones only (0:
    all); images as in :func:`load_fashion_mnist`.

    Example::

        train = fashion_mnist_rdd(spark.sparkContext, "train", standardize=True)
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    paths = _idx_paths(data_dir)
    images_path, labels_path = paths[:2] if split == "train" else paths[2:]
    total = _idx_length(labels_path)
    samples = min(samples, total) if samples else total
    partitions = partitions or sc.defaultParallelism

    def read(index: int, _rows: Any) -> Any:
        return iter(_read_slice(images_path, labels_path, samples, partitions, standardize,
                                index))

    return sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(read)


def load_fashion_mnist(data_dir: str = FASHION_MNIST_DIR, standardize: bool = False
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fashion-MNIST as (train images, train labels, test images, test labels).

    Images are float32 in [0, 1] shaped (N, 1, 28, 28) (with ``standardize``, shifted and
    scaled by FASHION_MNIST_MEAN and FASHION_MNIST_STD); labels int64 in 0..9. The files come
    from Debian's ``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``)
    or any directory holding the four standard IDX files.
    """
    train_x, train_y, test_x, test_y = (read_idx(p) for p in _idx_paths(data_dir))
    return (_images(train_x, standardize), train_y.astype(np.int64),
            _images(test_x, standardize), test_y.astype(np.int64))
