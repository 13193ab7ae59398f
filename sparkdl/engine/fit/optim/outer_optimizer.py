"""The local rounds' outer optimizer, as the user names it (driver side).

The outer optimizer takes the samples-weighted average delta ``w_r - avg(w_i)`` as the gradient
of the round's weights ``w_r`` (:mod:`sparkdl.engine.strategies.rounds`): ``"average"`` (or
None) is SGD with lr 1.0 (plain averaging), ``"nesterov"`` is DiLoCo's SGD with lr 0.7,
momentum 0.9 and Nesterov; a callable takes the model's trainable parameters and returns a
torch optimizer.

Example::

    check_outer("DistriOptimizer", "nesterov")
    outer = outer_optimizer("nesterov", [p for p in model.parameters() if p.requires_grad])
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ....errors import InvalidArgumentError

__all__ = ["OUTER_OPTIMIZERS", "outer_optimizer", "check_outer", "describe_outer"]

OUTER_OPTIMIZERS = ("average", "nesterov")
"""The outer optimizers named by a string (a callable is the third form)."""


def check_outer(owner: str, value: Any) -> Any:
    """``outer_optimizer`` as given, checked: None, one of :data:`OUTER_OPTIMIZERS`, or a
    callable."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and value in OUTER_OPTIMIZERS:
        return value
    raise InvalidArgumentError(
        f"{owner}: outer_optimizer must be None, 'average', 'nesterov' or a callable that "
        f"takes the model's parameters and returns a torch optimizer; got {value!r}.")


def describe_outer(value: Any) -> str:
    """How the log and the resume key name an outer optimizer."""
    if value is None or value == "average":
        return "average"
    if isinstance(value, str):
        return value
    return f"callable {getattr(value, '__qualname__', type(value).__name__)}"


def outer_optimizer(value: Any, params: Iterable[torch.nn.Parameter],
                    owner: str = "DistriOptimizer") -> Any:
    """The outer optimizer over ``params`` (see the module docstring)."""
    params = list(params)
    if value is None or value == "average":
        return torch.optim.SGD(params, lr=1.0)
    if value == "nesterov":
        return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    made = value(params)
    if not isinstance(made, torch.optim.Optimizer):
        raise InvalidArgumentError(
            f"{owner}: outer_optimizer({len(params)} parameters) returned "
            f"{type(made).__name__}, not a torch.optim.Optimizer.")
    return made
