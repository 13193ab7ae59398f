"""How a task's vector travels to the AllReduce: full precision, or gradients in bfloat16.

A codec encodes a slice ``[lo, lo + len)`` of the flat vector into a buffer (bytes, or the slice
itself when nothing changes) on the executor and decodes bytes back to the vector's dtype where
it is summed. :class:`Bf16Codec` halves the bytes of the gradient part (values below
``exact_from``) by rounding them to bfloat16 (8 exponent bits, as fp32, so no overflow; 8
significant bits); the buffer part after it (BatchNorm statistics, integer counters) stays exact.
Sums are always formed in the vector's own dtype.

Example::

    codec = Bf16Codec(exact_from=layout.num_param_values)
    payload = codec.encode(vector[lo:hi], lo)
    codec.decode(payload, lo, hi - lo)          # float32 again, gradients rounded
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ExactCodec", "Bf16Codec", "make_codec", "COMPRESSIONS"]

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
    """Gradient values (index < ``exact_from``) as bfloat16, the rest exact."""

    name = "bf16"

    def __init__(self, dtype: np.dtype, exact_from: int) -> None:
        self.dtype = np.dtype(dtype)
        self.exact_from = int(exact_from)

    def _rounded(self, lo: int, length: int) -> int:
        return int(min(max(self.exact_from - lo, 0), length))

    def encode(self, values: np.ndarray, lo: int) -> bytes:
        n = self._rounded(lo, len(values))
        half = torch.from_numpy(np.ascontiguousarray(values[:n])).to(torch.bfloat16)
        return half.view(torch.int16).numpy().tobytes() + values[n:].tobytes()

    def decode(self, payload: bytes, lo: int, length: int) -> np.ndarray:
        n = self._rounded(lo, length)
        half = torch.from_numpy(np.frombuffer(payload, dtype=np.int16, count=n).copy())
        out = np.empty(length, dtype=self.dtype)
        out[:n] = half.view(torch.bfloat16).to(torch.float32).numpy()
        out[n:] = np.frombuffer(payload, dtype=self.dtype, offset=2 * n, count=length - n)
        return out


def make_codec(compression: str | None, dtype: np.dtype, exact_from: int) -> "ExactCodec | Bf16Codec":
    """The codec for ``compression`` (None or "bf16")."""
    if compression == "bf16":
        return Bf16Codec(dtype, exact_from)
    return ExactCodec(dtype)
