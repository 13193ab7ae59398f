"""How a task's vector travels to the AllReduce: full precision, or gradients in bfloat16.

A codec encodes a slice ``[lo, lo + len)`` of the flat vector into a buffer (bytes, or the slice
itself when nothing changes) on the executor and decodes bytes back to the vector's dtype where
it is summed. :class:`Bf16Codec` halves the bytes of the gradient part (values below
``exact_from``) by rounding them to bfloat16 (8 exponent bits, as fp32, so no overflow; 8
significant bits); the buffer part after it (BatchNorm statistics, integer counters) stays exact.
Sums are always formed in the vector's own dtype.

Example::

    codec = Bf16Codec(np.float32, exact_from=layout.num_param_values)
    payload = codec.encode(vector[lo:hi], lo)
    codec.decode(payload, lo, hi - lo)          # float32 again, gradients rounded
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["ExactCodec", "Bf16Codec", "make_codec", "make_pass_codec", "COMPRESSIONS"]

COMPRESSIONS = (None, "bf16")


class ExactCodec:
    """The vector's own bytes."""

    name = "none"

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)

    def encode(self, values: np.ndarray, lo: int) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=self.dtype)    # a view: sent without a copy

    def decode(self, payload: bytes, lo: int, length: int) -> np.ndarray:
        return np.frombuffer(payload, dtype=self.dtype, count=length)


class Bf16Codec:
    """The values in the ``rounded`` ranges (a fit's gradient values: indices below
    ``exact_from``; a pass's: each bf16 fit's gradient range) as bfloat16, the rest exact."""

    name = "bf16"

    def __init__(self, dtype: np.dtype, exact_from: int | None = None,
                 rounded: Sequence[tuple[int, int]] = ()) -> None:
        self.dtype = np.dtype(dtype)
        spans = list(rounded) + ([(0, int(exact_from))] if exact_from is not None else [])
        self.rounded = tuple(sorted((int(a), int(b)) for a, b in spans if b > a))

    def _pieces(self, lo: int, length: int) -> list[tuple[int, int, bool]]:
        """``[lo, lo + length)`` as ``(start, stop, rounded)`` pieces relative to ``lo``."""
        out, at = [], 0
        for a, b in self.rounded:
            a, b = max(a - lo, at), min(b - lo, length)
            if b <= a:
                continue
            if a > at:
                out.append((at, a, False))
            out.append((a, b, True))
            at = b
        if at < length:
            out.append((at, length, False))
        return out

    def encode(self, values: np.ndarray, lo: int) -> bytes:
        parts = []
        for a, b, rounded in self._pieces(lo, len(values)):
            piece = np.ascontiguousarray(values[a:b], dtype=self.dtype)
            parts.append(torch.from_numpy(piece).to(torch.bfloat16).view(torch.int16).numpy()
                         .tobytes() if rounded else piece.tobytes())
        return b"".join(parts)

    def decode(self, payload: bytes, lo: int, length: int) -> np.ndarray:
        out = np.empty(length, dtype=self.dtype)
        offset = 0
        for a, b, rounded in self._pieces(lo, length):
            if rounded:
                half = torch.from_numpy(np.frombuffer(payload, dtype=np.int16, count=b - a,
                                                      offset=offset).copy())
                out[a:b] = half.view(torch.bfloat16).to(torch.float32).numpy()
                offset += 2 * (b - a)
            else:
                out[a:b] = np.frombuffer(payload, dtype=self.dtype, count=b - a, offset=offset)
                offset += (b - a) * self.dtype.itemsize
        return out


def make_codec(compression: str | None, dtype: np.dtype, exact_from: int) -> "ExactCodec | Bf16Codec":
    """The codec for ``compression`` (None or "bf16")."""
    if compression == "bf16":
        return Bf16Codec(dtype, exact_from)
    return ExactCodec(dtype)


def make_pass_codec(codecs: Sequence[Any], sizes: Sequence[int], dtype: np.dtype
                    ) -> "ExactCodec | Bf16Codec":
    """The codec of a pass's vector (:mod:`sparkdl.engine.fit_set`): each fit's vector, one
    after another (``sizes``), travels as that fit's own codec (``codecs``) sends it, so every
    fit sums bitwise as alone."""
    rounded, at = [], 0
    for codec, size in zip(codecs, sizes):
        rounded.extend((at + a, at + b) for a, b in getattr(codec, "rounded", ()))
        at += int(size)
    return Bf16Codec(dtype, rounded=rounded) if rounded else ExactCodec(dtype)
