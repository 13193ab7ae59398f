"""The global loss scale of ``precision="16-mixed"``, decided on the driver (driver side).

float16 gradients underflow unless the loss is scaled up before backward. Single-process PyTorch
keeps one scale in ``torch.amp.GradScaler``; sparkdl keeps one for the whole cluster: every task
multiplies its weighted loss by the current scale, the driver gets the summed (scaled) gradient,
and :class:`LossScaler` applies GradScaler's rules to it: if any value is inf or NaN the step is
skipped and the scale multiplied by ``backoff_factor``; otherwise the gradient is unscaled (times
``1 / scale`` in float32, as GradScaler does) and the step taken, and after ``growth_interval``
steps in a row without inf/NaN the scale is multiplied by ``growth_factor``. Defaults are
GradScaler's, so a run equals single-process training with autocast and GradScaler on the same
batches.

Example::

    scaler = LossScaler()
    found_inf = not np.isfinite(summed).all()
    if not found_inf:
        summed *= scaler.inverse()
    scaler.update(found_inf)           # next scale
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["PRECISIONS", "LossScaler"]

PRECISIONS = ("32", "bf16-mixed", "16-mixed")


class LossScaler:
    """GradScaler's scale schedule for one global scale (see the module docstring)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = 0
        self.skipped = 0

    def inverse(self) -> np.float32:
        """``1 / scale`` rounded as GradScaler rounds it (computed in float64, kept in float32)."""
        return np.float32(torch.tensor(self.scale, dtype=torch.float64).reciprocal().float())

    def update(self, found_inf: bool) -> None:
        """The scale after a step that found (or did not find) inf/NaN gradients."""
        scale = torch.tensor(self.scale, dtype=torch.float32)
        if found_inf:
            self.skipped += 1
            self.scale = float(scale * self.backoff_factor)
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            grown = scale * self.growth_factor
            if torch.isfinite(grown):
                self.scale = float(grown)
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.skipped = int(state.get("skipped", 0))
