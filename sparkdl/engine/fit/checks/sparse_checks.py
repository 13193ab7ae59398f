"""Checks, before any cluster work, that a model's sparse gradients can be trained as asked.

A table built with ``sparse=True`` (``nn.Embedding``, ``nn.EmbeddingBag``) hands its optimizer a
sparse gradient, which most torch optimizers refuse (``Adam``, ``AdamW``, ``RMSprop``; ``SGD``,
``Adagrad`` and ``SparseAdam`` take it). Rather than fail at the first step, after the data was
loaded, :func:`check_sparse_gradients` steps a stand-in of the table's optimizer (same class,
same hyperparameters, a two-row parameter) on a sparse gradient and reports torch's own error
with the parameter's name.

Example::

    check_sparse_gradients("DistriOptimizer", model, ParamLayout(model), optimizer, False)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ....errors import InvalidArgumentError
from ....transport.flat_layout import ParamLayout
from ..optim.optimizer_sequence import optimizer_members

__all__ = ["check_sparse_gradients"]

log = logging.getLogger("sparkdl")


def _probe_step(optimizer: torch.optim.Optimizer, group: dict[str, Any],
                param: torch.Tensor) -> None:
    """One step of a new optimizer of ``optimizer``'s class with ``group``'s settings, on a
    two-row stand-in of ``param`` whose gradient is sparse (raises what torch raises)."""
    probe = nn.Parameter(torch.zeros((2,) + tuple(param.shape[1:]), dtype=param.dtype))
    row = torch.ones((1,) + tuple(param.shape[1:]), dtype=param.dtype)
    probe.grad = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.long), row,
                                         tuple(probe.shape), check_invariants=False)
    settings = {k: v for k, v in group.items() if k != "params"}
    try:
        stand_in = type(optimizer)([dict(settings, params=[probe])])
    except Exception as exc:            # a constructor that needs more: the first step tells
        log.debug("cannot build a stand-in of %s to check sparse gradients: %s",
                  type(optimizer).__name__, exc)
        return
    stand_in.step()


def check_sparse_gradients(owner: str, model: nn.Module, layout: ParamLayout, optimizer: Any,
                           clipping: bool) -> None:
    """Every parameter with sparse gradients (``layout.sparse``) is held by an optimizer that
    takes them, and no gradient clipping is asked for (torch's clipping reads dense gradients)."""
    if not layout.sparse:
        return
    names = [layout.params[k].name for k in layout.sparse]
    if clipping:
        raise InvalidArgumentError(
            f"Gradient clipping cannot be combined with sparse gradients ({', '.join(names)}: "
            "nn.Embedding/EmbeddingBag with sparse=True): torch's clip_grad_norm_ and "
            "clip_grad_value_ read dense gradients. Build the tables with sparse=False, or train "
            "without clipping.")
    tensors = dict(model.named_parameters())
    by_id = {id(tensors[n]): n for n in names}
    for opt in optimizer_members(optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                name = by_id.get(id(p))
                if name is None:
                    continue
                try:
                    _probe_step(opt, group, p)
                except Exception as exc:
                    raise InvalidArgumentError(
                        f"The 'optimizer' argument of {owner}: the parameter {name!r} gets sparse "
                        f"gradients (a table built with sparse=True), which "
                        f"{type(opt).__name__} cannot take: {type(exc).__name__}: {exc}. Give "
                        "the tables an optimizer that takes sparse gradients (SparseAdam, "
                        "Adagrad, SGD), e.g. optimizer=[torch.optim.SparseAdam(tables), "
                        "torch.optim.Adam(rest)], or build them with sparse=False.") from exc
                break           # one probe per group: its settings are the group's
