"""Embedding ids checked against their table's size where they enter a batch (executor side;
also the driver's dry run and ``transform``).

torch answers an id outside ``0..num_embeddings - 1`` with ``IndexError: index out of range in
self`` on a CPU and with a device-side assert on a GPU, naming neither the id, the table nor the
row. :func:`checked_ids` puts, for the length of one batch's forward, a pre-hook on every
``nn.Embedding`` and ``nn.EmbeddingBag`` of the model (and every subclass that keeps their
``forward``: one with its own, such as a learned positional embedding, is given something
other than ids) that compares the ids the table is given with its size (``aminmax``: two
comparisons per id, one device sync per table, never a pass over the table) and raises the
:class:`IdOrigin`'s error class with the id, the table, its size and where the id comes from:
the model input (a column, for the estimators) when the ids are (a view of) one of the batch's
inputs, and the record of the partition.

Example::

    origin = IdOrigin(names=["column 'user'"], partition=3, records=chunk)
    with checked_ids(model, inputs, origin):
        output = model(*inputs)        # TrainingDataError: column 'user' holds id 30, ...
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..data.ragged import Ragged
from ..errors import TrainingDataError

__all__ = ["IdOrigin", "checked_ids", "argument_names"]

_TABLE_TYPES = (nn.Embedding, nn.EmbeddingBag)
_TABLES: "weakref.WeakKeyDictionary[nn.Module, list[tuple[str, nn.Module]]]" = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


@dataclass
class IdOrigin:
    """Where a batch comes from, for the message: ``names`` describe the model's arguments in
    order (``"column 'user'"``; shorter or empty: "model input k"), ``records`` the record
    (within ``partition``) of each row of the batch, ``what`` the data ("training",
    "validation", "transform"), ``error`` the class raised."""

    names: Sequence[str | None] = ()
    partition: int | None = None
    records: np.ndarray | None = None
    what: str = "training"
    error: type = TrainingDataError


def argument_names(features: Sequence[Any], names: Sequence[str] | None,
                   collate: Any = None) -> list[str | None]:
    """The description of each model argument made from ``features`` (one array per input,
    :class:`Ragged` for sequences, which become two arguments: the padded ids and their
    lengths) by :func:`sparkdl.data.ragged.model_arguments`: ``"column 'c'"`` with the
    estimators' column ``names``, else ``"input k of the features"`` (``"the features"`` for
    one input). Empty under a ``collate``, whose arguments are its own."""
    if collate is not None:
        return []
    out: list[str | None] = []
    for k, f in enumerate(features):
        if names and k < len(names):
            name = f"column '{names[k]}'"
        else:
            name = "the features" if len(features) == 1 else f"input {k} of the features"
        out.extend([name, f"{name} (lengths)"] if isinstance(f, Ragged) else [name])
    return out


def _tables(model: nn.Module) -> list[tuple[str, nn.Module]]:
    with _LOCK:
        found = _TABLES.get(model)
        if found is None:
            # only tables that look their input up as ids: a subclass with its own forward
            # (Hugging Face's learned positional embeddings look up positions) is not checked
            found = [(name or type(m).__name__, m) for name, m in model.named_modules()
                     if isinstance(m, _TABLE_TYPES) and
                     type(m).forward in (nn.Embedding.forward, nn.EmbeddingBag.forward)]
            _TABLES[model] = found
    return found


@contextmanager
def checked_ids(model: nn.Module, inputs: Sequence[Any], origin: IdOrigin) -> Iterator[None]:
    """While the block runs, every embedding table of ``model`` checks the ids it looks up
    (``inputs``: the batch's model arguments, to say which one the ids come from)."""
    tables = _tables(model)
    if not tables:
        yield
        return
    handles = [module.register_forward_pre_hook(partial(_check, name, inputs, origin),
                                                with_kwargs=True)
               for name, module in tables]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _check(name: str, inputs: Sequence[Any], origin: IdOrigin, module: nn.Module,
           args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ids = args[0] if args else kwargs.get("input")
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.numel() == 0:
        return None        # torch's own error names a float id tensor well enough
    rows = int(module.num_embeddings)
    low, high = torch.stack(torch.aminmax(ids)).tolist()    # one sync per table on a GPU
    if low < 0 or high >= rows:
        raise _out_of_range(name, rows, ids, inputs, origin)
    return None


def _locate(ids: torch.Tensor, position: tuple[int, ...], inputs: Sequence[Any]
            ) -> tuple[int | None, int | None]:
    """Which model argument ``ids`` is (a view of), and the batch row of the element at
    ``position``: ``(argument, row)``, None where unknown (ids the model computed)."""
    ptr = ids.untyped_storage().data_ptr()
    offset = ids.storage_offset() + sum(p * s for p, s in zip(position, ids.stride()))
    for k, arg in enumerate(inputs):
        if not isinstance(arg, torch.Tensor) or arg.numel() == 0 or \
                arg.untyped_storage().data_ptr() != ptr:
            continue
        if arg.ndim == 0 or arg.stride(0) <= 0:
            return k, None
        row = (offset - arg.storage_offset()) // arg.stride(0)
        return k, (row if 0 <= row < arg.shape[0] else None)
    return None, None


def _out_of_range(name: str, rows: int, ids: torch.Tensor, inputs: Sequence[Any],
                  origin: IdOrigin) -> Exception:
    flat = ids.detach().reshape(-1)
    first = int(((flat < 0) | (flat >= rows)).nonzero()[0, 0])
    value = int(flat[first])
    position = tuple(int(i) for i in np.unravel_index(first, tuple(ids.shape)))
    argument, row = _locate(ids, position, inputs)
    if argument is None:
        head = f"The model looks up id {value} in embedding '{name}'"
    else:
        source = (origin.names[argument] if argument < len(origin.names)
                  and origin.names[argument] else f"model input {argument}")
        verb = "hold" if source == "the features" else "holds"
        head = f"{source[0].upper()}{source[1:]} {verb} id {value}"
    if value < 0:
        problem = f"ids must be >= 0 (embedding '{name}' has {rows} rows)"
    else:
        problem = f"embedding '{name}' has {rows} rows (ids 0..{rows - 1})"
    if row is not None and origin.records is not None and row < len(origin.records):
        where = f"record {int(origin.records[row])}" + (
            f" of partition {origin.partition}" if origin.partition is not None else "")
    elif origin.partition is not None:
        where = f"a batch of partition {origin.partition}"
    else:
        where = "a batch"
    return origin.error(f"{head}, but {problem}: {where} of the {origin.what} data. Every id "
                        "must index a row of its table: make the table larger or map the ids "
                        "into 0..rows-1.")
