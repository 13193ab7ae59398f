"""Objects cloudpickled with their large CPU tensors' bytes out of band, rebuilt on them.

torch pickles a tensor's storage as a ``bytes`` object inside the pickle stream, made through an
``io.BytesIO``: a model shipped that way is copied twice on the driver (the storage's bytes, then
the stream) and twice again in the worker that unpickles it (the stream read, then each
storage's bytes object, then the storage built from it): a worker building a replica of a large
model held about three copies of its weights at once. :func:`dumps_out_of_band` pickles the
object (with cloudpickle, as the specs were) but sends each large plain CPU tensor's storage as
an out-of-band buffer (pickle protocol 5): an :class:`OutOfBand` holds the small stream and those
buffers, themselves views of the tensors' memory. A broadcast of it
(:func:`~sparkdl.transport.pieced_broadcast.pieced_broadcast`) cuts the buffers into pieces
without a copy, and the task reads them into buffers of their own sizes, on which
:meth:`OutOfBand.load` rebuilds the tensors (``torch.frombuffer``): the worker holds the weights
once. Tensors that share a storage (tied weights, views) share it again after loading; anything
else (small, GPU, sparse, quantized, subclass tensors, hooks or attributes of their own) is
pickled by torch as before.

Example::

    shipped = dumps_out_of_band(spec)        # on the driver: no copy of the weights
    spec = shipped.load()                    # in a task: tensors on the received buffers
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pyspark import cloudpickle
from torch import nn

__all__ = ["OutOfBand", "dumps_out_of_band", "OUT_OF_BAND_MIN_BYTES"]

OUT_OF_BAND_MIN_BYTES = 1 << 20
"""The smallest storage sent out of band (smaller ones stay in the stream, as torch pickles
them)."""


@dataclass
class OutOfBand:
    """A cloudpickle stream and the storages' buffers it refers to (uint8 arrays: pickled out
    of band again by a protocol 5 pickler, such as a pieced broadcast's)."""

    stream: bytes
    buffers: list[np.ndarray]

    def load(self) -> Any:
        """The object. The first load after unpickling builds its large tensors on
        :attr:`buffers` (no copy); every other load (a second replica in the same worker
        reading a cached broadcast, or the driver's own object, whose buffers are the model's
        memory) on copies of them, so that no two objects ever share a tensor's memory."""
        fresh = self.__dict__.pop("_received", False)      # atomic: one load gets them
        buffers = self.buffers if fresh else [np.array(b, copy=True) for b in self.buffers]
        return pickle.loads(self.stream, buffers=buffers)

    def __getstate__(self) -> dict[str, Any]:
        return {"stream": self.stream, "buffers": self.buffers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.stream, self.buffers = state["stream"], state["buffers"]
        self._received = True


class _StorageBuffer:
    """One storage's bytes as a pickle buffer (one instance per storage in a dump, so that the
    pickler's memo makes every tensor on that storage refer to one buffer)."""

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: int) -> tuple[Any, tuple[Any, ...]]:
        data = torch.empty(0, dtype=torch.uint8).set_(self.storage).numpy()
        return _storage_on, (pickle.PickleBuffer(data),)


def _storage_on(buffer: Any) -> torch.UntypedStorage:
    if not memoryview(buffer).readonly:
        return torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    # an in-band buffer (a small broadcast's stream) is read-only: its own copy
    return torch.frombuffer(bytearray(buffer), dtype=torch.uint8).untyped_storage()


def _tensor_on(storage: torch.UntypedStorage, dtype: torch.dtype, shape: tuple[int, ...],
               stride: tuple[int, ...], offset: int, requires_grad: bool,
               parameter: bool) -> torch.Tensor:
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    if parameter:
        return nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def _plain(tensor: torch.Tensor) -> bool:
    """A dense CPU tensor or parameter with nothing torch's own pickling keeps besides its
    data, dtype, geometry and ``requires_grad``."""
    return (type(tensor) in (torch.Tensor, nn.Parameter) and tensor.layout == torch.strided
            and tensor.device.type == "cpu" and not tensor.is_quantized
            and not tensor.is_conj() and not tensor.is_neg() and tensor.grad_fn is None
            and not getattr(tensor, "_backward_hooks", None) and not tensor.__dict__
            and all(name is None for name in getattr(tensor, "names", None) or ())
            and tensor.untyped_storage().nbytes() >= OUT_OF_BAND_MIN_BYTES)


class _OutOfBandPickler(cloudpickle.CloudPickler):
    def __init__(self, file: io.BytesIO, buffers: list[pickle.PickleBuffer]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._storages: dict[tuple[int, int], _StorageBuffer] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and _plain(obj):
            storage = obj.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            ref = self._storages.get(key)
            if ref is None:
                ref = self._storages[key] = _StorageBuffer(storage)
            return _tensor_on, (ref, obj.dtype, tuple(obj.shape), tuple(obj.stride()),
                                obj.storage_offset(), obj.requires_grad,
                                type(obj) is nn.Parameter)
        return super().reducer_override(obj)


def dumps_out_of_band(obj: Any) -> OutOfBand:
    """``obj`` cloudpickled with its large plain CPU tensors' storages out of band (see the
    module docstring); the buffers are views of those storages, so the tensors must not change
    until the result is broadcast or written."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _OutOfBandPickler(out, buffers).dump(obj)
    return OutOfBand(out.getvalue(), [np.asarray(b.raw()) for b in buffers])
