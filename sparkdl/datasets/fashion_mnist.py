"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (IDX files; no downloads).

Example::

    from sparkdl.datasets import load_fashion_mnist
    train_x, train_y, test_x, test_y = load_fashion_mnist(standardize=True)
"""

from __future__ import annotations

import gzip
import os

import numpy as np

__all__ = ["read_idx", "load_fashion_mnist", "FASHION_MNIST_DIR", "FASHION_MNIST_MEAN",
           "FASHION_MNIST_STD", "FASHION_MNIST_CLASSES"]

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


def load_fashion_mnist(data_dir: str = FASHION_MNIST_DIR, standardize: bool = False
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fashion-MNIST as (train images, train labels, test images, test labels).

    Images are float32 in [0, 1] shaped (N, 1, 28, 28) (with ``standardize``, shifted and
    scaled by FASHION_MNIST_MEAN and FASHION_MNIST_STD); labels int64 in 0..9. The files come
    from Debian's ``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``)
    or any directory holding the four standard IDX files.
    """
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
    train_x, train_y, test_x, test_y = (read_idx(p) for p in paths)

    def images(a: np.ndarray) -> np.ndarray:
        x = (a.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
        return (x - FASHION_MNIST_MEAN) / FASHION_MNIST_STD if standardize else x

    return images(train_x), train_y.astype(np.int64), images(test_x), test_y.astype(np.int64)
