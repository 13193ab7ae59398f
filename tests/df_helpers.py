"""DataFrames and models for the DataFrame API tests (importable on executors)."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import torch


def mlp(d_in: int = 4, classes: int = 3) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(d_in, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, classes))


def mlp4() -> torch.nn.Module:
    return mlp(4, 3)


def blobs(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 0.8).astype(int)
    return x, y


def vector_df(spark, n: int = 300, seed: int = 0, sparse: bool = False):
    from pyspark.ml.linalg import Vectors

    x, y = blobs(n, seed)
    make = (lambda v: Vectors.sparse(4, {i: float(a) for i, a in enumerate(v) if i != 3})) \
        if sparse else (lambda v: Vectors.dense(v))
    return spark.createDataFrame([(make(a), int(b), i % 4 == 0)
                                  for i, (a, b) in enumerate(zip(x, y))],
                                 ["features", "label", "isVal"])


def _png(path: str, pixels: np.ndarray) -> None:
    """Write an 8-bit RGB PNG without an imaging library."""
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[r].tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def image_folder(path: str, n: int = 40, size: int = 6, seed: int = 0) -> dict[str, int]:
    """PNG files whose label is whether the red channel is bright; returns file name -> label."""
    rng = np.random.default_rng(seed)
    labels = {}
    os.makedirs(path, exist_ok=True)
    for i in range(n):
        label = i % 2
        img = rng.integers(0, 90, size=(size, size, 3), dtype=np.uint8)
        if label:
            img[:, :, 0] += 150
        name = f"img{i:03d}.png"
        _png(os.path.join(path, name), img)
        labels[name] = label
    return labels
