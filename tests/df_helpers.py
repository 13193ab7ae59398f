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


class IdBagClassifier(torch.nn.Module):
    """Mean of id embeddings, then a linear layer; refuses anything but int64 ids."""

    def __init__(self, vocab: int = 60, classes: int = 3) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(vocab, 16, mode="mean")
        self.out = torch.nn.Linear(16, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        assert ids.dtype == torch.int64, ids.dtype
        return self.out(self.bag(ids))


def id_bags(n: int = 600, vocab: int = 60, length: int = 5, seed: int = 0):
    """Rows of ``length`` ids all drawn from one class's random id set; label = that class.
    Which ids belong to which class is arbitrary, so only an id lookup solves it."""
    rng = np.random.default_rng(seed)
    owner = rng.permutation(vocab) % 3
    labels = rng.integers(0, 3, n)
    rows = [rng.choice(np.flatnonzero(owner == c), length).tolist() for c in labels]
    return rows, labels


class ThreeInputNet(torch.nn.Module):
    """A recommender-shaped model: a user id (int64 scalar), tag ids (int64 array) and dense
    features (float Vector) -> one score."""

    def __init__(self, users: int = 20, tags: int = 30) -> None:
        super().__init__()
        self.user = torch.nn.Embedding(users, 4)
        self.tags = torch.nn.EmbeddingBag(tags, 4, mode="sum")
        self.dense = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(12, 1)

    def forward(self, user: torch.Tensor, tags: torch.Tensor, dense: torch.Tensor):
        assert user.dtype == torch.int64 and user.ndim == 1, (user.dtype, user.shape)
        assert tags.dtype == torch.int64 and tags.ndim == 2, (tags.dtype, tags.shape)
        assert dense.dtype == self.dense.weight.dtype, dense.dtype
        h = torch.cat([self.user(user), self.tags(tags), self.dense(dense)], dim=1)
        return self.head(torch.relu(h)).squeeze(1)


def three_input_rows(n: int = 120, seed: int = 0):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 20, n)
    tags = rng.integers(0, 30, (n, 3))
    dense = rng.normal(size=(n, 3))
    y = (users % 3) * 0.5 + (tags % 2).sum(axis=1) * 0.3 + dense[:, 0]
    return users, tags, dense, y


class SequenceMeanNet(torch.nn.Module):
    """Masked mean of the embeddings of a padded id sequence (then a linear layer): takes the
    padded ids and the lengths, as sparkdl passes a variable-length input; with ``extra`` a
    leading int64 id (a user) is embedded too."""

    def __init__(self, vocab: int = 60, classes: int = 3, extra: int = 0) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.user = torch.nn.Embedding(extra, 8) if extra else None
        self.out = torch.nn.Linear(8, classes)

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        user, (ids, lengths) = (args[0], args[1:]) if self.user is not None else (None, args)
        assert ids.dtype == torch.int64 and lengths.dtype == torch.int64
        assert ids.shape[1] == int(lengths.max()), "padded to the batch's longest row"
        mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        summed = (self.emb(ids) * mask[..., None]).sum(1)
        h = summed / lengths.clamp(min=1)[:, None].to(summed.dtype)
        if user is not None:
            h = h + self.user(user)
        return self.out(h)


def id_sequences(n: int = 400, vocab: int = 60, seed: int = 0, max_len: int = 12):
    """Rows of 1..max_len ids drawn from one class's id set; label = that class."""
    rng = np.random.default_rng(seed)
    owner = rng.permutation(vocab) % 3
    labels = rng.integers(0, 3, n)
    rows = [rng.choice(np.flatnonzero(owner == c), int(rng.integers(1, max_len + 1)))
            for c in labels]
    return rows, labels
