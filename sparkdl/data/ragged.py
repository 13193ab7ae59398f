"""Variable-length inputs: rows of different lengths kept as values plus offsets, padded per batch.

A sequence input (a user's history, a title's tokens, a genre list) is stored without padding:
one flat ``values`` array and ``offsets`` (row ``i`` is ``values[offsets[i]:offsets[i + 1]]``),
so its memory follows the number of elements. When a batch is formed, :func:`model_arguments`
pads it to the batch's longest row with the padding value, and the model receives **two
arguments for it, in this order**: the padded tensor ``[batch, longest]`` (the values' dtype:
int64 ids or the model's float dtype) and the lengths ``[batch]`` (int64). A ``collate``
function replaces that rule: it gets the batch's inputs (:class:`Ragged` for sequences, arrays
otherwise) and returns the model's arguments.

Example::

    seqs = Ragged.from_rows([np.array([3, 1, 4]), np.array([1]), np.array([5, 9])])
    padded, lengths = seqs.take(np.array([0, 1])).pad(0)
    # padded = [[3, 1, 4], [1, 0, 0]], lengths = [3, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Ragged", "model_arguments"]


@dataclass
class Ragged:
    """Rows of different lengths: ``values`` (all rows' elements, concatenated) and ``offsets``
    (``len(rows) + 1`` int64 positions into ``values``)."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_rows(cls, rows: Sequence[Any], dtype: Any = None) -> "Ragged":
        """Rows (1-D array-likes) as one Ragged."""
        arrays = [np.asarray(r).reshape(-1) for r in rows]
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = (np.concatenate(arrays) if arrays else np.zeros(0, dtype or np.float32))
        return cls(values.astype(dtype, copy=False) if dtype is not None else values, offsets)

    @classmethod
    def concatenate(cls, parts: Sequence["Ragged"]) -> "Ragged":
        used = [p.values[p.offsets[0]:p.offsets[-1]] for p in parts]   # each part's own rows
        values = np.concatenate(used)
        shifts = np.cumsum([0] + [len(v) for v in used[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] - p.offsets[0] + s
                                          for p, s in zip(parts, shifts)])
        return cls(values, offsets.astype(np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.offsets.nbytes)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets).astype(np.int64)

    def astype(self, dtype: Any) -> "Ragged":
        return Ragged(self.values.astype(dtype, copy=False), self.offsets)

    def take(self, indices: np.ndarray) -> "Ragged":
        """The given rows, in that order, as a new in-memory Ragged."""
        starts, ends = self.offsets[indices], self.offsets[np.asarray(indices) + 1]
        lengths = (ends - starts).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if len(lengths):
            positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
            values = np.asarray(self.values[positions])
        else:
            values = np.zeros(0, self.values.dtype)
        return Ragged(values, offsets)

    def pad(self, padding_value: float) -> tuple[np.ndarray, np.ndarray]:
        """``(padded [rows, longest], lengths [rows])``: every row left-aligned, the rest
        ``padding_value``."""
        lengths = self.lengths()
        longest = int(lengths.max()) if len(lengths) else 0
        padded = np.full((len(lengths), longest), padding_value, dtype=self.values.dtype)
        mask = np.arange(longest)[None, :] < lengths[:, None]
        padded[mask] = self.values[self.offsets[0]:self.offsets[-1]]
        return padded, lengths


def model_arguments(features: Sequence[Any], padding_value: float = 0.0,
                    collate: Callable[[list[Any]], Sequence[Any]] | None = None) -> list[Any]:
    """The model's arguments for a batch of ``features`` (arrays, and :class:`Ragged` for
    sequences): each sequence padded and followed by its lengths, or whatever ``collate``
    returns (see the module docstring)."""
    if collate is not None:
        return list(collate(list(features)))
    args: list[Any] = []
    for f in features:
        if isinstance(f, Ragged):
            args.extend(f.pad(padding_value))
        else:
            args.append(f)
    return args
