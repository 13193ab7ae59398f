"""Gradient clipping on the driver, on the union gradient, before ``optimizer.step()``.

The summed gradient is exactly the one single-process PyTorch computes on the union batch, so
clipping it with torch's own functions gives the single-process result:
:meth:`GradientClipping.apply` calls ``torch.nn.utils.clip_grad_norm_`` (``max_norm``,
``norm_type``) and clamps every gradient into ``[min_value, max_value]`` (what
``clip_grad_value_`` does for ``[-v, v]``); with both set, values are clamped first.

Example::

    opt.set_gradient_clipping(1.0)                    # L2 norm of all gradients <= 1
    opt.set_constant_gradient_clipping(-0.5, 0.5)     # every gradient value in [-0.5, 0.5]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ....argument_checks import argument_error

__all__ = ["GradientClipping", "check_norm_clipping", "check_value_clipping"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_norm_clipping(owner: str, max_norm: Any, norm_type: Any) -> tuple[float, float]:
    """``(max_norm, norm_type)`` as floats, or the standard error."""
    if not _number(max_norm) or not math.isfinite(max_norm) or max_norm <= 0:
        raise argument_error("max_norm", owner, "a finite number > 0", max_norm)
    if not _number(norm_type) or math.isnan(norm_type) or norm_type <= 0:
        raise argument_error("norm_type", owner, "a number > 0 or float('inf')", norm_type)
    return float(max_norm), float(norm_type)


def check_value_clipping(owner: str, min_value: Any, max_value: Any) -> tuple[float, float]:
    """``(min_value, max_value)`` as floats with ``min_value < max_value``."""
    for name, value in (("min_value", min_value), ("max_value", max_value)):
        if not _number(value) or not math.isfinite(value):
            raise argument_error(name, owner, "a finite number", value)
    if not min_value < max_value:
        raise argument_error("max_value", owner, f"greater than min_value ({min_value})",
                             max_value)
    return float(min_value), float(max_value)


@dataclass(frozen=True)
class GradientClipping:
    """Which clipping to apply (either or both)."""

    max_norm: float | None = None
    norm_type: float = 2.0
    min_value: float | None = None
    max_value: float | None = None

    def apply(self, model: nn.Module) -> None:
        """Clip the gradients of ``model``'s parameters in place (those without one skipped)."""
        params = [p for p in model.parameters() if p.grad is not None]
        if self.min_value is not None and self.max_value is not None:
            for p in params:
                p.grad.clamp_(self.min_value, self.max_value)
        if self.max_norm is not None and params:
            torch.nn.utils.clip_grad_norm_(params, self.max_norm, self.norm_type)
