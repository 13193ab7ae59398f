"""A flat vector held as the consecutive arrays it is made of, never joined unless asked.

A task's gradient vector is its parameters' ``.grad`` tensors one after another. Copying them
into one array means holding the gradients twice while the copy runs (for a model of two large
matrices, one and a half times the gradient at once, beside the weights), only for the shuffle's
map side to cut the array into blocks again. :class:`SegmentedVector` keeps the gradients
where autograd left them: a slice inside one segment is a view of it, a slice across segments a
new array of the slice's length (a block: at most a JVM record), and only a whole-vector
consumer (``np.asarray``, an arithmetic ufunc) joins them.

Example::

    vector = SegmentedVector([np.arange(3.0), np.zeros(2)])
    vector[1:4]            # array([1., 2., 0.]): a new array (it spans two segments)
    vector[0:2]            # a view of the first segment
    np.asarray(vector)     # array([0., 1., 2., 0., 0.])
"""

from __future__ import annotations

import bisect
from typing import Any, BinaryIO, Sequence

import numpy as np

__all__ = ["SegmentedVector", "copy_vector_into", "write_vector"]


class SegmentedVector:
    """The concatenation of 1-D ``segments`` of one dtype (see the module docstring)."""

    ndim = 1

    def __init__(self, segments: Sequence[np.ndarray]) -> None:
        if not segments:
            raise ValueError("a segmented vector needs at least one segment")
        dtypes = {s.dtype for s in segments}
        if len(dtypes) != 1 or any(s.ndim != 1 for s in segments):
            raise ValueError(f"segments must be 1-D arrays of one dtype, got "
                             f"{sorted(str(d) for d in dtypes)} with dimensions "
                             f"{sorted({s.ndim for s in segments})}")
        self.segments = list(segments)
        self.dtype = self.segments[0].dtype
        self.starts = np.cumsum([0] + [len(s) for s in self.segments]).tolist()
        self.size = self.starts[-1]

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError(f"a segmented vector is read in contiguous slices, not {index!r}")
        lo, hi, _ = index.indices(self.size)
        hi = max(lo, hi)
        k = min(bisect.bisect_right(self.starts, lo) - 1, len(self.segments) - 1)
        if hi <= self.starts[k + 1]:                    # inside one segment: a view
            return self.segments[k][lo - self.starts[k]:hi - self.starts[k]]
        out = np.empty(hi - lo, dtype=self.dtype)
        self.copy_range_into(out, lo)
        return out

    def copy_range_into(self, out: np.ndarray, lo: int = 0) -> None:
        """``self[lo:lo + len(out)]`` copied into ``out``, segment by segment."""
        pos, hi = lo, lo + len(out)
        k = bisect.bisect_right(self.starts, pos) - 1
        while pos < hi:
            start, stop = self.starts[k], self.starts[k + 1]
            take = min(hi, stop) - pos
            out[pos - lo:pos - lo + take] = self.segments[k][pos - start:pos - start + take]
            pos += take
            k += 1

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.size, dtype=self.dtype)
        self.copy_range_into(out)
        return out if dtype is None else out.astype(dtype, copy=False)


def copy_vector_into(out: np.ndarray, vector: Any) -> None:
    """``out[:] = vector`` without joining a :class:`SegmentedVector` first."""
    if isinstance(vector, SegmentedVector):
        vector.copy_range_into(out)
    else:
        out[:] = vector


def write_vector(out: BinaryIO, vector: Any) -> None:
    """A vector's bytes written to ``out`` (a :class:`SegmentedVector` segment by segment)."""
    segments = vector.segments if isinstance(vector, SegmentedVector) else [vector]
    for segment in segments:
        out.write(memoryview(np.ascontiguousarray(segment)).cast("B"))
