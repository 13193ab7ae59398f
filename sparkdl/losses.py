"""Losses whose mean is not over rows: the numerator and the normaliser of a mean loss.

A mean loss over a union batch is ``sum of the loss terms / normaliser``. For most losses the
normaliser is proportional to the number of rows, and a task's mean weighted by its share of the
rows is exact. For some it is not:

- ``CrossEntropyLoss`` / ``NLLLoss`` with class-index targets divide by the number of targets
  that are not ``ignore_index`` (padded tokens), or, with class ``weight``, by the sum of the
  weights of those targets' classes;
- a custom criterion may declare its own (e.g. a masked regression loss): give it a method
  ``sum_and_normaliser(output, target) -> (loss_sum, normaliser)`` returning the loss summed over
  its terms (a scalar tensor with grad) and the number (or total weight) of those terms; its
  ``__call__`` must still return the mean, ``loss_sum / normaliser``, which validation and the dry
  run use.

For those, every task back-propagates its numerator and reports its normaliser; the driver
divides the summed gradient and loss by the union batch's normaliser
(:mod:`sparkdl.engine.strategies.sync.step`), which is exactly the single-process mean.

Example::

    class MaskedMSE(torch.nn.Module):
        def sum_and_normaliser(self, output, target):
            mask = ~torch.isnan(target)
            return ((output - target.nan_to_num()) ** 2 * mask).sum(), mask.sum()

        def forward(self, output, target):
            total, count = self.sum_and_normaliser(output, target)
            return total / count

    has_normaliser(torch.nn.CrossEntropyLoss(ignore_index=0))       # True
    loss, multiplier, normaliser = loss_terms(criterion, output, target)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["has_normaliser", "divided_on_driver", "loss_terms", "NORMALISER_METHOD",
           "CLASS_INDEX_LOSSES", "IGNORE_INDEX"]

IGNORE_INDEX = -100
"""torch's default ``ignore_index`` (``CrossEntropyLoss``, ``NLLLoss``), which Hugging Face's
losses use too: the label of padded or masked-out positions."""

NORMALISER_METHOD = "sum_and_normaliser"
"""The method a custom criterion defines to declare its normaliser."""

CLASS_INDEX_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
"""torch losses whose targets are class indices (int64), with ``ignore_index`` and ``weight``."""


def has_normaliser(criterion: Any) -> bool:
    """True when ``criterion``'s mean is not a mean over rows (see the module docstring): torch's
    ``CrossEntropyLoss``/``NLLLoss`` with ``reduction='mean'``, or a criterion that defines
    ``sum_and_normaliser``."""
    if callable(getattr(criterion, NORMALISER_METHOD, None)):
        return True
    return isinstance(criterion, CLASS_INDEX_LOSSES) and criterion.reduction == "mean"


def divided_on_driver(criterion: Any, reduction: str, sample_weights: bool) -> bool:
    """Whether the tasks of a run report the numerator and normaliser of a criterion with a
    normaliser (sample-weighted runs do so with the sum of the weights instead)."""
    return not sample_weights and reduction == "mean" and has_normaliser(criterion)


def _class_index_normaliser(criterion: nn.Module, output: torch.Tensor,
                            target: torch.Tensor) -> float:
    """What torch divides by in the ``'mean'`` reduction of CrossEntropyLoss/NLLLoss."""
    if target.is_floating_point():
        # class probabilities (CrossEntropyLoss only): the mean is over the positions
        classes = output.shape[1] if output.ndim > 1 else output.shape[0]
        return float(target.numel() // max(1, classes))
    kept = target[target != criterion.ignore_index]
    weight = criterion.weight
    if weight is None:
        return float(kept.numel())
    return float(weight.to(kept.device, torch.float64)[kept].sum())


def loss_terms(criterion: Any, output: Any, target: torch.Tensor
               ) -> tuple[torch.Tensor | None, float, float]:
    """``(loss, multiplier, normaliser)`` of one batch, ``loss * multiplier`` being the loss
    summed over the batch's terms: torch's mean times its normaliser for the built-in losses (so
    a task weighting that mean by ``normaliser / batch_size`` does the same arithmetic as one
    weighting a plain mean by its share of rows), the declared sum (multiplier 1) for a
    criterion with ``sum_and_normaliser``. ``loss`` is None when the batch has no term (every
    target ignored): it contributes nothing."""
    method = getattr(criterion, NORMALISER_METHOD, None)
    if callable(method):
        loss_sum, normaliser = method(output, target)
        return loss_sum, 1.0, float(normaliser)
    normaliser = _class_index_normaliser(criterion, output, target)
    if normaliser == 0:
        return None, 0.0, 0.0
    return criterion(output, target), normaliser, normaliser
