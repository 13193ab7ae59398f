"""Row-sparse gradients: the embedding tables whose gradient is a sparse COO tensor.

``nn.Embedding(sparse=True)`` and ``nn.EmbeddingBag(sparse=True)`` give their ``weight`` a
sparse gradient: the rows the batch touched, each once per occurrence. Such a table does not
travel in the flat gradient vector (:mod:`sparkdl.transport.flat_layout`); a task sends it as
*rows*: the sorted, unique ids it touched and one summed row per id. Sums over tasks are formed
in partition order (:func:`sum_rows`), so every path (the driver's, the shuffle's blocks, the
in-process runner) gives bitwise the same rows, and the driver hands the optimizer a coalesced
sparse gradient equal to the single-process one up to float rounding (torch coalesces the
duplicates of its own gradient in another order).

Example::

    names = sparse_parameter_names(model)           # {"user.weight", "item.weight"}
    rows = rows_of(model.user.weight.grad, np.float32)
    total = sum_rows([rows_task0, rows_task1], np.float32)
    model.user.weight.grad = sparse_grad(total, model.user.weight)
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch
from torch import nn

__all__ = ["Rows", "sparse_parameter_names", "rows_of", "sum_rows", "split_rows", "sparse_grad",
           "rows_nbytes", "gather_rows", "scale_rows", "rows_finite"]

Rows = tuple[np.ndarray, np.ndarray]
"""``(ids, values)``: sorted unique int64 row ids and a float array with one row per id."""


def sparse_parameter_names(model: nn.Module) -> set[str]:
    """Names of the trainable parameters that receive sparse gradients: the ``weight`` of every
    ``nn.Embedding`` and ``nn.EmbeddingBag`` built with ``sparse=True``."""
    names = set()
    for prefix, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse \
                and module.weight.requires_grad:
            names.add(f"{prefix}.weight" if prefix else "weight")
    return names


def sum_rows(parts: Iterable[Rows], dtype: np.dtype) -> Rows:
    """The rows of ``parts`` added up by id, in the order of ``parts`` (and, within a part, of
    its rows): one deterministic, sequential sum per id. Ids come out sorted and unique."""
    given = [p for p in parts if p is not None]
    parts = [p for p in given if len(p[0])]
    if not parts:           # no rows: keep the row shape where one was given
        values = np.asarray(given[0][1], dtype=dtype) if given else np.zeros((0,), dtype)
        return np.zeros(0, np.int64), values[:0]
    ids = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
    values = np.concatenate([np.asarray(p[1], dtype=dtype) for p in parts])
    order = np.argsort(ids, kind="stable")        # keeps the parts' order for equal ids
    ids, values = ids[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    if len(starts) == len(ids):
        return ids, values
    return ids[starts], np.add.reduceat(values, starts, axis=0)


def rows_of(grad: torch.Tensor, dtype: np.dtype) -> Rows:
    """A sparse COO gradient (coalesced or not, on any device) as rows summed by id in its
    stored order, in ``dtype``."""
    grad = grad.detach().cpu()
    ids = grad._indices()[0].numpy()
    torch_dtype = torch.from_numpy(np.zeros(0, dtype)).dtype
    values = grad._values().to(torch_dtype).numpy()
    return sum_rows([(ids, values)], dtype)


def split_rows(rows: Rows, bounds: np.ndarray) -> list[Rows]:
    """``rows`` cut by id range: part ``k`` holds the ids in ``[bounds[k], bounds[k + 1])``."""
    ids, values = rows
    cuts = np.searchsorted(ids, bounds)
    return [(ids[cuts[k]:cuts[k + 1]], values[cuts[k]:cuts[k + 1]])
            for k in range(len(bounds) - 1)]


def sparse_grad(rows: Rows, param: torch.Tensor) -> torch.Tensor:
    """The coalesced sparse COO gradient of ``param`` holding ``rows``, in its dtype."""
    ids, values = rows
    values = np.ascontiguousarray(values).reshape((len(ids),) + tuple(param.shape[1:]))
    if not values.flags.writeable:
        values = values.copy()
    return torch.sparse_coo_tensor(torch.from_numpy(np.ascontiguousarray(ids)).reshape(1, -1),
                                   torch.from_numpy(values).to(param.dtype), tuple(param.shape),
                                   is_coalesced=True, check_invariants=False)


def rows_nbytes(rows: dict[int, Rows] | None) -> int:
    """Bytes of the ids and values of ``rows``."""
    return sum(i.nbytes + v.nbytes for i, v in (rows or {}).values())


def gather_rows(reports: Iterable[Any], dtype: np.dtype) -> dict[int, Rows]:
    """The sum over tasks of their reports' ``sparse_rows``, in partition order, by parameter."""
    ordered = sorted((r for r in reports if getattr(r, "sparse_rows", None)),
                     key=lambda r: r.partition)
    params = sorted({k for r in ordered for k in r.sparse_rows})
    return {k: sum_rows([r.sparse_rows.get(k) for r in ordered], dtype) for k in params}


def scale_rows(rows: dict[int, Rows], factor: float) -> dict[int, Rows]:
    """``rows`` with every value multiplied by ``factor`` (new arrays, same dtype)."""
    return {k: (ids, (values * factor).astype(values.dtype, copy=False))
            for k, (ids, values) in rows.items()}


def rows_finite(rows: dict[int, Rows] | None) -> bool:
    """True when no value of ``rows`` is inf or NaN."""
    return all(np.isfinite(values).all() for _, values in (rows or {}).values())
