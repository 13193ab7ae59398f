"""Embedding tables' gradients as rows: what a task sends instead of a whole table.

Two kinds of table travel so, outside the flat gradient vector
(:mod:`sparkdl.transport.flat_layout`):

* **sparse**: ``nn.Embedding(sparse=True)`` and ``nn.EmbeddingBag(sparse=True)`` give their
  ``weight`` a sparse COO gradient: the rows the batch touched, once per occurrence. A task
  sends the sorted unique ids it touched and one summed row per id; the driver hands the
  optimizer a coalesced sparse gradient (equal to the single-process one up to float rounding:
  torch coalesces its duplicates in another order).
* **dense** (the same modules with ``sparse=False``): the gradient is a dense table whose
  untouched rows are exactly zero. A task sends only its non-zero rows (a row of ``-0.0`` counts
  as non-zero, so nothing changes bit for bit) when that is smaller than the table, else the
  whole table; the driver rebuilds the dense gradient, zeros elsewhere. The choice is made per
  table per task per iteration.

``Rows`` is ``(ids, values)``: ``ids`` sorted unique int64 row ids with one value row each, or an
int ``first`` for the contiguous rows ``first, first + 1, ...`` (a whole table, or a block of
one). Sums over tasks are formed in partition order, one sequential sum per row
(:func:`sum_rows`), which is the order of the flat vector's sums: every path (the driver's, the
shuffle's blocks, the in-process runner) gives bitwise the same gradient, and a dense table
summed as rows is bitwise the table summed in the vector.

Example::

    kinds = table_parameters(model)                 # {"user.weight": True, "genre.weight": False}
    rows = rows_of(model.user.weight.grad, np.float32)
    total = sum_rows([rows_task0, rows_task1], np.float32)
    model.user.weight.grad = sparse_grad(total, model.user.weight)
"""

from __future__ import annotations

from typing import Any, Iterable, Union

import numpy as np
import torch
from torch import nn

__all__ = ["Rows", "table_parameters", "rows_of", "dense_rows", "sum_rows", "split_rows",
           "join_rows", "sparse_grad", "dense_grad", "row_ids", "gather_rows", "scale_rows",
           "rows_finite"]

Rows = tuple[Union[np.ndarray, int], np.ndarray]
"""``(ids, values)``; see the module docstring."""


def table_parameters(model: nn.Module) -> dict[str, bool]:
    """The trainable ``weight`` of every ``nn.Embedding`` and ``nn.EmbeddingBag`` of ``model``,
    by name: True where the module was built with ``sparse=True``."""
    tables = {}
    for prefix, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.weight.requires_grad:
            tables.setdefault(f"{prefix}.weight" if prefix else "weight", bool(module.sparse))
    return tables


def row_ids(rows: Rows) -> np.ndarray:
    """The explicit ids of ``rows``."""
    ids, values = rows
    if isinstance(ids, (int, np.integer)):
        return np.arange(int(ids), int(ids) + len(values), dtype=np.int64)
    return ids


def _contiguous(rows: Rows) -> bool:
    return isinstance(rows[0], (int, np.integer))


def sum_rows(parts: Iterable[Rows | None], dtype: np.dtype) -> Rows:
    """The rows of ``parts`` added up by id, in the order of ``parts``: one deterministic,
    sequential sum per id, starting from zero (``np.add.reduceat`` would not add in order). Parts that are all the same contiguous rows are added as arrays;
    otherwise ids come out explicit, sorted and unique."""
    given = [p for p in parts if p is not None]
    if given and all(_contiguous(p) for p in given) and \
            len({(int(p[0]), len(p[1])) for p in given}) == 1:
        total = np.array(given[0][1], dtype=dtype, copy=True)
        for _, values in given[1:]:
            total += values
        return int(given[0][0]), total
    nonempty = [p for p in given if len(p[1])]
    if not nonempty:        # no rows: keep the row shape where one was given
        values = np.asarray(given[0][1], dtype=dtype) if given else np.zeros((0,), dtype)
        return np.zeros(0, np.int64), values[:0]
    ids = np.concatenate([row_ids(p) for p in nonempty]).astype(np.int64, copy=False)
    values = np.concatenate([np.asarray(p[1], dtype=dtype) for p in nonempty])
    unique, where = np.unique(ids, return_inverse=True)
    total = np.zeros((len(unique),) + values.shape[1:], dtype=dtype)
    # unbuffered, element by element in the parts' order: 0 + a + b + ..., as the flat
    # vector's sum of the dense tables (whose untouched rows are zeros) adds them
    np.add.at(total, where.reshape(-1), values)
    return unique, total


def rows_of(grad: torch.Tensor, dtype: np.dtype) -> Rows:
    """A sparse COO gradient (coalesced or not, on any device) as rows summed by id in its
    stored order, in ``dtype``."""
    grad = grad.detach().cpu()
    ids = grad._indices()[0].numpy()
    values = grad._values().to(_torch_dtype(dtype)).numpy()
    return sum_rows([(ids, values)], dtype)


def dense_rows(grad: torch.Tensor, dtype: np.dtype) -> Rows:
    """A dense table gradient (on any device) as its non-zero rows, or as the whole table when
    that is smaller, in ``dtype``."""
    flat = grad.detach().reshape(grad.shape[0], -1)
    row_bytes = flat.shape[1] * np.dtype(dtype).itemsize
    touched = ((flat != 0) | torch.signbit(flat)).any(dim=1)
    count = int(touched.sum())
    if count * (row_bytes + 8) < flat.shape[0] * row_bytes:
        ids = torch.nonzero(touched).reshape(-1)
        return ids.cpu().numpy(), flat[ids].to(_torch_dtype(dtype)).cpu().numpy()
    return 0, flat.to(_torch_dtype(dtype)).cpu().numpy()


def split_rows(rows: Rows, bounds: np.ndarray) -> list[Rows]:
    """``rows`` cut by id range: part ``k`` holds the ids in ``[bounds[k], bounds[k + 1])``."""
    ids, values = rows
    if _contiguous(rows):
        first, last = int(ids), int(ids) + len(values)
        parts = []
        for k in range(len(bounds) - 1):
            lo, hi = max(first, int(bounds[k])), min(last, int(bounds[k + 1]))
            hi = max(lo, hi)
            parts.append((lo, values[lo - first:hi - first]))
        return parts
    cuts = np.searchsorted(ids, bounds)
    return [(ids[cuts[k]:cuts[k + 1]], values[cuts[k]:cuts[k + 1]])
            for k in range(len(bounds) - 1)]


def join_rows(blocks: list[Rows]) -> Rows:
    """Rows of disjoint, ascending id ranges (the shuffle's blocks, in order) as one."""
    blocks = [b for b in blocks if len(b[1])]
    if not blocks:
        return np.zeros(0, np.int64), np.zeros((0,), np.float32)
    if all(_contiguous(b) for b in blocks) and all(
            int(b[0]) + len(b[1]) == int(c[0]) for b, c in zip(blocks, blocks[1:])):
        return int(blocks[0][0]), np.concatenate([b[1] for b in blocks])
    return (np.concatenate([row_ids(b) for b in blocks]),
            np.concatenate([b[1] for b in blocks]))


def sparse_grad(rows: Rows, param: torch.Tensor) -> torch.Tensor:
    """The coalesced sparse COO gradient of ``param`` holding ``rows``, in its dtype."""
    ids = np.ascontiguousarray(row_ids(rows))
    values = _writable(np.ascontiguousarray(rows[1]).reshape((len(ids),) + tuple(param.shape[1:])))
    return torch.sparse_coo_tensor(torch.from_numpy(ids).reshape(1, -1),
                                   torch.from_numpy(values).to(param.dtype), tuple(param.shape),
                                   is_coalesced=True, check_invariants=False)


def dense_grad(rows: Rows, param: torch.Tensor) -> torch.Tensor:
    """The dense gradient of ``param``: ``rows`` where given, zeros elsewhere, in its dtype."""
    ids, values = rows
    row_shape = tuple(param.shape[1:])
    if _contiguous(rows) and int(ids) == 0 and len(values) == param.shape[0]:
        return torch.from_numpy(_writable(values)).reshape(param.shape).to(param.dtype)
    grad = torch.zeros(param.shape, dtype=param.dtype)
    if len(values):
        grad[torch.from_numpy(row_ids(rows))] = torch.from_numpy(_writable(values)).reshape(
            (len(values),) + row_shape).to(param.dtype)
    return grad


def gather_rows(reports: Iterable[Any], dtype: np.dtype) -> dict[int, Rows]:
    """The sum over tasks of their reports' ``table_rows``, in partition order, by parameter."""
    ordered = sorted((r for r in reports if getattr(r, "table_rows", None)),
                     key=lambda r: r.partition)
    params = sorted({k for r in ordered for k in r.table_rows})
    return {k: sum_rows([r.table_rows.get(k) for r in ordered], dtype) for k in params}


def scale_rows(rows: dict[int, Rows], factor: float) -> dict[int, Rows]:
    """``rows`` with every value multiplied by ``factor`` (new arrays, same dtype)."""
    return {k: (ids, (values * factor).astype(values.dtype, copy=False) if factor
                else np.zeros_like(values)) for k, (ids, values) in rows.items()}


def rows_finite(rows: dict[int, Rows] | None) -> bool:
    """True when no value of ``rows`` is inf or NaN."""
    return all(np.isfinite(values).all() for _, values in (rows or {}).values())


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()
