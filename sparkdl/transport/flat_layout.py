"""One flat vector for a model's trainable parameters and its buffers.

What travels between the driver and the tasks is always a single contiguous numpy vector:
the weights (broadcast), the gradients (AllReduce). The layout is taken once from the model and is
the same on both sides, so only numbers cross the wire.

Layout: trainable parameters in ``named_parameters()`` order, then every buffer in
``named_buffers()`` order (integer buffers such as BatchNorm's ``num_batches_tracked`` are carried
as floats and rounded back).

Example::

    layout = ParamLayout(net)
    vec = layout.weights_vector(net)   # params then buffers
    layout.load_weights(net, vec)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..errors import InvalidArgumentError

__all__ = ["ParamLayout"]


@dataclass(frozen=True)
class _Slot:
    name: str
    shape: tuple[int, ...]
    start: int
    stop: int
    dtype: torch.dtype


class ParamLayout:
    """Offsets of each parameter and buffer of a model inside the flat vector."""

    def __init__(self, model: nn.Module) -> None:
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not params:
            raise InvalidArgumentError("The model has no trainable parameters (requires_grad=True).")
        dtypes = {p.dtype for _, p in params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise InvalidArgumentError(
                "All trainable parameters of the model must share one floating dtype; "
                f"got {sorted(str(d) for d in dtypes)}.")
        self.torch_dtype: torch.dtype = next(iter(dtypes))
        self.numpy_dtype = torch.empty(0, dtype=self.torch_dtype).numpy().dtype
        offset = 0
        self.params: list[_Slot] = []
        for name, p in params:
            self.params.append(_Slot(name, tuple(p.shape), offset, offset + p.numel(), p.dtype))
            offset += p.numel()
        self.num_param_values = offset
        self.buffers: list[_Slot] = []
        for name, b in model.named_buffers():
            if b is None:
                continue
            self.buffers.append(_Slot(name, tuple(b.shape), offset, offset + b.numel(), b.dtype))
            offset += b.numel()
        self.size = offset

    def _check(self, model: nn.Module) -> None:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        if names != [s.name for s in self.params]:
            raise InvalidArgumentError(
                "The model's trainable parameters differ from the layout it was trained with.")

    def weights_vector(self, model: nn.Module) -> np.ndarray:
        """Parameters and buffers of ``model`` copied into one new vector."""
        out = np.empty(self.size, dtype=self.numpy_dtype)
        state = dict(model.named_parameters())
        state.update(dict(model.named_buffers()))
        for slot in self.params + self.buffers:
            out[slot.start:slot.stop] = state[slot.name].detach().reshape(-1).to(
                self.torch_dtype).cpu().numpy()
        return out

    def load_weights(self, model: nn.Module, vector: np.ndarray) -> None:
        """Copy a vector made by :meth:`weights_vector` into ``model`` (in place)."""
        self.load_params(model, vector)
        self.load_buffers(model, vector)

    def load_params(self, model: nn.Module, vector: np.ndarray) -> None:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for slot in self.params:
                src = torch.from_numpy(np.asarray(vector[slot.start:slot.stop]))
                params[slot.name].copy_(src.view(slot.shape))

    def load_buffers(self, model: nn.Module, vector: np.ndarray) -> None:
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for slot in self.buffers:
                src = torch.from_numpy(np.asarray(vector[slot.start:slot.stop])).view(slot.shape)
                if not slot.dtype.is_floating_point:
                    src = torch.round(src)
                buffers[slot.name].copy_(src.to(slot.dtype))

    def write_grads(self, model: nn.Module, out: np.ndarray) -> None:
        """Copy the parameters' ``.grad`` into ``out[:num_param_values]`` (zeros where None)."""
        params = dict(model.named_parameters())
        for slot in self.params:
            g = params[slot.name].grad
            if g is None:
                out[slot.start:slot.stop] = 0
            else:
                out[slot.start:slot.stop] = g.reshape(-1).numpy()

    def write_buffers(self, model: nn.Module, out: np.ndarray, scale: float) -> None:
        """Copy the buffers, multiplied by ``scale``, into their slots of ``out``."""
        buffers = dict(model.named_buffers())
        for slot in self.buffers:
            b = buffers[slot.name].detach().reshape(-1).to(self.torch_dtype).numpy()
            np.multiply(b, scale, out=out[slot.start:slot.stop])

    def set_grads(self, model: nn.Module, vector: np.ndarray) -> None:
        """Make ``vector[:num_param_values]`` the parameters' ``.grad`` (driver side)."""
        params = dict(model.named_parameters())
        for slot in self.params:
            g = torch.from_numpy(np.array(vector[slot.start:slot.stop], copy=True))
            params[slot.name].grad = g.view(slot.shape)
