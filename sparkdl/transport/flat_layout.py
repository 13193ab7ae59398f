"""Where each parameter and buffer of a model sits in what travels between driver and tasks.

Three things travel, laid out once from the model, identically on both sides:

* the **state** (driver to tasks, every iteration): every trainable parameter and every buffer as
  its own raw bytes, one ``uint8`` vector. Nothing is converted, so a bfloat16 weight or an int64
  counter at ``2**40 + 7`` arrives bit for bit.
* the **gradient vector** (tasks to driver, summed by the AllReduce): the trainable parameters'
  gradients in the *gradient dtype*: the parameters' own dtype for float64 and float32, float32 for
  float16 and bfloat16 parameters (the sum is formed in float32, then cast back on the driver).
* the **rows** of the embedding tables' gradients (``nn.Embedding``, ``nn.EmbeddingBag``): not
  in the vector; each task reports the rows it touched (:mod:`sparkdl.transport.table_rows`).
* beside it, in each task's report: which parameters received a gradient (a parameter that got
  none on every task keeps ``grad = None`` on the driver, as in torch, so optimizers skip it) and
  the raw bytes of every buffer the task changed (see :func:`combine_buffers` for the rule).

The layout also has a fingerprint (names, shapes, dtypes, trainability of every parameter and
buffer) that travels with each iteration, so a task whose replica was laid out differently fails
with a clear error instead of misreading the vector.

Example::

    layout = ParamLayout(net)
    state = layout.state_vector(net)            # uint8: params then buffers, raw bytes
    layout.load_state(replica, state)
    grads, present = layout.gradients(replica)  # after backward()
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import InvalidArgumentError, SparkdlError
from .segmented_vector import SegmentedVector
from .table_rows import Rows, dense_grad, dense_rows, rows_of, sparse_grad, table_parameters

__all__ = ["ParamLayout", "combine_buffers", "summed_presence", "raw_bytes",
           "SUPPORTED_PARAM_DTYPES"]

SUPPORTED_PARAM_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
_ALIGN = 16


@dataclass(frozen=True)
class _Slot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    start: int          # element offset in the gradient vector (parameters only)
    stop: int
    byte_start: int     # byte offset in the state vector
    byte_stop: int
    rows: bool = False      # an embedding table: travels as rows, not in the gradient vector
    sparse: bool = False    # ... whose gradient is a sparse tensor (sparse=True)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def raw_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a uint8 array (a view where possible)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else np.zeros(0, np.uint8)


class ParamLayout:
    """Offsets of a model's trainable parameters and buffers (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not params:
            raise InvalidArgumentError("The model has no trainable parameters (requires_grad=True).")
        dtypes = {p.dtype for _, p in params}
        if len(dtypes) != 1 or next(iter(dtypes)) not in SUPPORTED_PARAM_DTYPES:
            raise InvalidArgumentError(
                "All trainable parameters of the model must share one dtype among float64, "
                f"float32, bfloat16 and float16; got {sorted(str(d) for d in dtypes)}. Convert "
                "the model with .float(), .double(), .bfloat16() or .half().")
        self.param_dtype: torch.dtype = next(iter(dtypes))
        half = self.param_dtype in (torch.float16, torch.bfloat16)
        self.torch_dtype: torch.dtype = torch.float32 if half else self.param_dtype
        self.numpy_dtype = _numpy_dtype(self.torch_dtype)
        """The gradient vector's dtype."""
        self.data_dtype = (np.dtype(np.float16) if self.param_dtype == torch.float16
                           else self.numpy_dtype)
        """The dtype floating training data is stored in (bfloat16 data is kept as float32 and
        cast by the tasks)."""
        offset, byte_offset = 0, 0
        self.params: list[_Slot] = []
        tables = table_parameters(model)
        for name, p in params:
            nbytes = p.numel() * p.element_size()
            length = 0 if name in tables else p.numel()
            self.params.append(_Slot(name, tuple(p.shape), p.dtype, offset, offset + length,
                                     byte_offset, byte_offset + nbytes, name in tables,
                                     tables.get(name, False)))
            offset += length
            byte_offset += -(-nbytes // _ALIGN) * _ALIGN
        self.num_param_values = offset
        self.size = offset
        """Length of the gradient vector."""
        self.tables = [k for k, slot in enumerate(self.params) if slot.rows]
        """Indices of the parameters whose gradients travel as rows (embedding tables)."""
        self.sparse = [k for k, slot in enumerate(self.params) if slot.sparse]
        """... of those whose gradients are sparse tensors."""
        self.buffers: list[_Slot] = []
        for name, b in model.named_buffers():
            if b is None:
                continue
            nbytes = b.numel() * b.element_size()
            self.buffers.append(_Slot(name, tuple(b.shape), b.dtype, 0, 0, byte_offset,
                                      byte_offset + nbytes))
            byte_offset += -(-nbytes // _ALIGN) * _ALIGN
        self.state_bytes = byte_offset
        described = [(n, tuple(t.shape), str(t.dtype), bool(t.requires_grad))
                     for n, t in model.named_parameters()]
        described += [(n, tuple(b.shape), str(b.dtype), False) for n, b in model.named_buffers()
                      if b is not None]
        if tables:
            described.append(("tables", sorted(tables.items())))
        self.fingerprint = hashlib.sha1(repr(described).encode()).hexdigest()[:16]
        self._pinned: dict[str, torch.Tensor] = {}      # reused page-locked host buffers
        self._pinned_copy: Any = None                   # CUDA event of the last copy from one

    def _host_buffer(self, name: str, size: int, dtype: torch.dtype) -> torch.Tensor:
        """A page-locked host buffer for transfers to and from a GPU, allocated once."""
        buf = self._pinned.get(name)
        if buf is None or buf.numel() != size or buf.dtype != dtype:
            buf = torch.empty(size, dtype=dtype).pin_memory()
            self._pinned[name] = buf
        return buf

    def _state_on(self, state: np.ndarray, device: torch.device) -> torch.Tensor:
        """The state vector as a uint8 tensor on ``device`` (one host-to-device copy)."""
        host = torch.from_numpy(state if state.flags.writeable else state.copy())
        if device.type != "cuda":
            return host
        pending = self._pinned_copy
        if pending is not None:
            pending.synchronize()           # the last copy out of the buffer has finished
        pinned = self._host_buffer("state", host.numel(), torch.uint8)
        pinned.copy_(host)
        on_device = pinned.to(device, non_blocking=True)
        self._pinned_copy = torch.cuda.Event()
        self._pinned_copy.record()
        return on_device

    # ----------------------------------------------------------------------- state (weights)
    def state_vector(self, model: nn.Module) -> np.ndarray:
        """Trainable parameters and buffers of ``model`` as raw bytes, in one new vector."""
        out = np.zeros(self.state_bytes, dtype=np.uint8)
        tensors = dict(model.named_parameters())
        tensors.update(dict(model.named_buffers()))
        for slot in self.params + self.buffers:
            out[slot.byte_start:slot.byte_stop] = raw_bytes(tensors[slot.name])
        return out

    def bind_params(self, model: nn.Module, state: np.ndarray, skip: Iterable[int] = ()
                    ) -> set[int]:
        """Make each trainable parameter of ``model`` on the CPU (but those numbered in
        ``skip``) a view of its bytes in ``state``, a vector :meth:`state_vector` made from the
        same model: the parameter keeps its identity and values, its data now lives in the
        vector, so the driver holds the weights once rather than twice (model and state).
        Returns the parameters bound; the optimizer's in-place updates then write the state.

        Only a parameter whose data no other tensor can see is bound (:func:`sole_owner`): one
        that shares its storage with any other tensor (a ``state_dict()`` taken earlier, a
        view of a flat buffer, a tied weight's alias) or that is not contiguous keeps its data,
        so every tensor the user holds on it still follows training. (A numpy array the
        parameter was made from with ``torch.from_numpy`` does not: read the parameter.)"""
        tensors = dict(model.named_parameters())
        skipped, bound = set(skip), set()
        with torch.no_grad():
            for k, slot in enumerate(self.params):
                p = tensors[slot.name]
                if k in skipped or p.device.type != "cpu" or not sole_owner(p):
                    continue
                view = torch.from_numpy(state[slot.byte_start:slot.byte_stop])
                p.data = view.view(slot.dtype).view(slot.shape)
                bound.add(k)
        return bound

    def bound_in(self, p: torch.Tensor, state: np.ndarray, k: int) -> bool:
        """Whether ``p`` (parameter ``k``) still is the view of ``state`` that
        :meth:`bind_params` made (code that replaces a parameter's ``.data``, as
        ``vector_to_parameters`` does, unbinds it)."""
        return (p.data_ptr() == state.ctypes.data + self.params[k].byte_start
                and p.is_contiguous())

    def _tensor(self, state: np.ndarray, slot: _Slot) -> torch.Tensor:
        raw = torch.from_numpy(np.array(state[slot.byte_start:slot.byte_stop], copy=True))
        return raw.view(slot.dtype).view(slot.shape)

    def load_state(self, model: nn.Module, state: np.ndarray,
                   skip: Iterable[int] = ()) -> None:
        """Copy a vector made by :meth:`state_vector` into ``model`` (in place, bit for bit), on
        whichever device the model is; the parameters numbered in ``skip`` are left as they
        are."""
        tensors = dict(model.named_parameters())
        tensors.update(dict(model.named_buffers()))
        device = next(iter(tensors.values())).device
        skipped = set(skip)
        # skipping tables on a GPU: the other slots one by one, not the whole state over the bus
        blob = self._state_on(state, device if not skipped else torch.device("cpu"))
        slots = [s for k, s in enumerate(self.params) if k not in skipped] + self.buffers
        with torch.no_grad():
            for slot in slots:
                part = blob[slot.byte_start:slot.byte_stop]
                tensors[slot.name].copy_(part.view(slot.dtype).view(slot.shape))

    def param_value(self, state: np.ndarray, index: int) -> torch.Tensor:
        """Trainable parameter ``index`` as it is in ``state``."""
        return self._tensor(state, self.params[index])

    def buffer_value(self, state: np.ndarray, index: int) -> torch.Tensor:
        """Buffer ``index`` as it is in ``state``."""
        return self._tensor(state, self.buffers[index])

    # --------------------------------------------------------------------- task side
    def gradients(self, model: nn.Module, release: bool = False, segmented: bool = False
                  ) -> tuple[np.ndarray | SegmentedVector, np.ndarray]:
        """The parameters' ``.grad`` as one vector (zeros where None) and which were present.
        With ``release``, each dense gradient on the CPU is dropped (``.grad = None``) as soon
        as it is in the vector, so the task never holds two whole copies of the gradients (the
        vector, then the gradients it was made from: two model-sized objects at once for a
        large model); the tables' gradients stay for :meth:`table_rows`. With ``segmented``
        too, nothing is copied: the vector is a
        :class:`~sparkdl.transport.segmented_vector.SegmentedVector` of the gradients
        themselves (the task holds the weights and one gradient, not a gradient and a half)."""
        present = np.zeros(len(self.params), dtype=np.int32)
        tensors = dict(model.named_parameters())
        grads = [tensors[slot.name].grad for slot in self.params]
        for k, g in enumerate(grads):
            present[k] = g is not None
        device = tensors[self.params[0].name].device
        if device.type == "cuda":      # one device-to-host copy through a reused pinned buffer
            flat = torch.cat([g.detach().reshape(-1).to(self.torch_dtype) if g is not None else
                              torch.zeros(s.stop - s.start, dtype=self.torch_dtype,
                                          device=device) for g, s in zip(grads, self.params)
                              if not s.rows])   # tables travel as rows (table_rows)
            pinned = self._host_buffer("grads", self.size, self.torch_dtype)
            pinned.copy_(flat)
            return pinned.numpy().copy(), present
        if release and segmented:
            segments = []
            for k, slot in enumerate(self.params):
                g, grads[k] = grads[k], None
                if g is None or slot.rows:
                    segments.append(np.zeros(slot.stop - slot.start, dtype=self.numpy_dtype))
                else:       # a view of the gradient (its tensor kept alive by the array)
                    segments.append(g.detach().reshape(-1).to(self.torch_dtype).numpy())
                    tensors[slot.name].grad = None
                del g
            return (SegmentedVector(segments) if segments else
                    np.zeros(0, dtype=self.numpy_dtype)), present
        out = np.zeros(self.size, dtype=self.numpy_dtype)
        for k, slot in enumerate(self.params):
            g, grads[k] = grads[k], None
            if g is not None and not slot.rows:
                out[slot.start:slot.stop] = g.detach().reshape(-1).to(self.torch_dtype).numpy()
                if release:
                    tensors[slot.name].grad = None
            del g                           # the last reference when released
        return out, present

    def table_rows(self, model: nn.Module) -> dict[int, Rows]:
        """The rows of every embedding table's gradient (by parameter index), in the gradient
        dtype; a parameter's gradient must be sparse exactly where the layout says so."""
        tensors = dict(model.named_parameters())
        rows: dict[int, Rows] = {}
        for k, slot in enumerate(self.params):
            g = tensors[slot.name].grad
            if g is None:
                continue
            if g.is_sparse != slot.sparse:
                raise InvalidArgumentError(
                    f"The parameter {slot.name!r} got a {'sparse' if g.is_sparse else 'dense'} "
                    "gradient in a task, but sparkdl takes sparse gradients from exactly the "
                    "weights of nn.Embedding and nn.EmbeddingBag built with sparse=True. Use "
                    "such a module for the table, or give it sparse=False (and do not use its "
                    "weight elsewhere in the model).")
            if slot.sparse:
                rows[k] = rows_of(g, self.numpy_dtype)
            elif slot.rows:
                rows[k] = dense_rows(g, self.numpy_dtype)
        return rows

    def buffer_bytes(self, state: np.ndarray) -> list[np.ndarray]:
        """A copy of every buffer's bytes in ``state`` (small: a task compares its buffers with
        them after dropping the state itself)."""
        return [np.array(state[slot.byte_start:slot.byte_stop], copy=True)
                for slot in self.buffers]

    def changed_buffers(self, model: nn.Module, state: np.ndarray | Sequence[np.ndarray]
                        ) -> dict[int, bytes]:
        """The raw bytes of every buffer of ``model`` that differs from its value in ``state``
        (a state vector, or what :meth:`buffer_bytes` took from one)."""
        tensors = dict(model.named_buffers())
        before = (self.buffer_bytes(state) if isinstance(state, np.ndarray) else state)
        changed = {}
        for k, slot in enumerate(self.buffers):
            raw = raw_bytes(tensors[slot.name])
            if not np.array_equal(raw, before[k]):
                changed[k] = raw.tobytes()
        return changed

    # --------------------------------------------------------------------- driver side
    def set_grads(self, model: nn.Module, vector: np.ndarray, present: np.ndarray,
                  rows: dict[int, Rows] | None = None) -> None:
        """``p.grad`` from the summed vector, cast to the parameter's dtype; None for every
        parameter that no task gave a gradient (``present[k] == 0``); a coalesced sparse
        gradient from ``rows[k]`` for a parameter with sparse gradients.

        Where no cast is needed the gradients are views into ``vector`` (no copy): the vector
        then belongs to the model's ``.grad`` until the optimizer's ``zero_grad``."""
        tensors = dict(model.named_parameters())
        if not vector.flags.writeable:
            vector = vector.copy()
        flat = torch.from_numpy(vector)
        for k, slot in enumerate(self.params):
            if not present[k]:
                tensors[slot.name].grad = None
                continue
            if slot.rows:
                got = (rows or {}).get(k)
                make = sparse_grad if slot.sparse else dense_grad
                tensors[slot.name].grad = None if got is None else make(got, tensors[slot.name])
                continue
            # .to() returns the view itself when the dtype already matches
            tensors[slot.name].grad = flat[slot.start:slot.stop].view(slot.shape).to(slot.dtype)

    def set_buffers(self, model: nn.Module, values: dict[int, torch.Tensor]) -> None:
        """Assign new values to the given buffers (in place)."""
        tensors = dict(model.named_buffers())
        with torch.no_grad():
            for k, value in values.items():
                slot = self.buffers[k]
                tensors[slot.name].copy_(value.view(slot.shape))


def _baseline_use_count() -> int | None:
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return None
    t = torch.empty(1)
    return int(use_count(t.untyped_storage()._cdata))


_BASELINE_USE_COUNT = _baseline_use_count()


def sole_owner(p: torch.Tensor) -> bool:
    """Whether ``p`` is the only tensor on its storage, all of it, contiguous and dense. False
    where torch cannot say how many tensors share a storage. (A numpy array a parameter was
    made from with ``torch.from_numpy`` is not a tensor: torch cannot see it.)"""
    if p.is_sparse or not p.is_contiguous() or p.storage_offset() or _BASELINE_USE_COUNT is None:
        return False
    storage = p.untyped_storage()
    if storage.nbytes() != p.numel() * p.element_size():
        return False
    return int(torch._C._storage_Use_Count(storage._cdata)) == _BASELINE_USE_COUNT


def combine_buffers(layout: ParamLayout, state: np.ndarray,
                    changes: Sequence[tuple[float, dict[int, bytes]]]) -> dict[int, torch.Tensor]:
    """The new value of every buffer some task changed, from ``(weight, changed)`` per task in
    partition order (``weight`` = the task's share ``|B_i| / |B|`` of the batch).

    The rule: a buffer no task changed keeps its value bit for bit (it is not in the result); a
    buffer every task left at one and the same value takes that value bit for bit; otherwise it
    becomes the sample-weighted average of the tasks' values, computed as
    ``old + sum_i w_i * (b_i - old)`` in float64 (a task that left it unchanged adds 0), then cast
    to the buffer's dtype (integers rounded, e.g. BatchNorm's ``num_batches_tracked``). Where the
    old value is not finite (an observer's ``min_val = inf``) the average is
    ``sum_i w_i * b_i`` with the old value for tasks that kept it.
    """
    touched = sorted({k for _, changed in changes for k in changed})
    out: dict[int, torch.Tensor] = {}
    for k in touched:
        slot = layout.buffers[k]
        old = layout.buffer_value(state, k)
        values = [changed.get(k) for _, changed in changes]
        nbytes = slot.byte_stop - slot.byte_start
        resized = [len(v) for v in values if v is not None and len(v) != nbytes]
        if resized:
            raise SparkdlError(
                f"The buffer {slot.name!r} changed its size in a task ({resized[0]} bytes instead "
                f"of {nbytes}): buffers must keep their shape during training (materialize lazy "
                "modules and resizing observers with one forward pass before training).")
        if all(v is not None and v == values[0] for v in values):
            out[k] = torch.frombuffer(bytearray(values[0]), dtype=slot.dtype).view(slot.shape) \
                if values[0] else old.clone()
            continue
        exact_ints = not (slot.dtype.is_floating_point or slot.dtype.is_complex)
        wide = torch.int64 if exact_ints else (torch.complex128 if slot.dtype.is_complex
                                               else torch.float64)
        base = old.to(wide)
        total = torch.zeros(slot.shape, dtype=torch.complex128 if slot.dtype.is_complex
                            else torch.float64)
        plain = torch.zeros_like(total)
        for (weight, changed), value in zip(changes, values):
            b = (base if value is None else
                 torch.frombuffer(bytearray(value), dtype=slot.dtype).view(slot.shape).to(wide))
            total += weight * (b - base).to(total.dtype)
            plain += weight * b.to(total.dtype)
        if exact_ints:
            out[k] = (base + torch.round(total).to(torch.int64)).to(slot.dtype)
        else:
            out[k] = torch.where(torch.isfinite(base), base + total, plain).to(slot.dtype)
    return out


def summed_presence(presences: Iterable[np.ndarray | None], num_params: int) -> np.ndarray:
    """How many tasks gave each parameter a gradient (tasks without a report pass None)."""
    total = np.zeros(num_params, dtype=np.int64)
    for p in presences:
        if p is not None:
            total += p
    return total
