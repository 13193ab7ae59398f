"""Your own training step: a function that computes a batch's loss from the model, in place of
``criterion(model(*inputs), target)``.

A training step is ``step(model, inputs, target) -> loss``: ``model`` is the task's replica (in
the train/eval modes the user left), ``inputs`` the list of model arguments of the task's rows
(tensors, as the model would receive them: sequences padded, or ``collate``'s result) and
``target`` the rows' labels. It returns either

- the loss as a **mean over those rows** (a scalar tensor with grad), or
- ``(loss_sum, normaliser)``: the loss summed over its terms (a scalar tensor with grad) and
  what a single process would divide that sum by (a number or a scalar tensor: the count of
  non-padded tokens, the total weight). The driver divides the summed gradient by the union
  batch's normaliser, so masked and weighted means are exact (the contract of
  :mod:`sparkdl.losses`).

The engine still owns backward, micro-batching, mixed precision, clipping, the AllReduce and the
optimizer, so exactness, determinism, recovery, validation and checkpoints are unchanged. Draw
any randomness from torch (seeded per task and iteration by the engine), not from numpy or
``random``, to keep runs bitwise reproducible.
Exactness holds for losses that are sums or means over samples; a loss that couples the rows of
a batch (in-batch negatives, batch statistics) is computed per task (per micro-batch), like
BatchNorm's batch statistics.

A **validation step** ``validation_step(model, inputs, target) -> output`` replaces the plain
``model(*inputs)`` call in validation; the metrics read what it returns. Without a criterion, the
:class:`sparkdl.metrics.Loss` metric is the training step's loss over the validation rows (the
model in eval mode, without grad).

Example::

    def step(model, inputs, target):                    # a Hugging Face token classifier
        loss = model(input_ids=inputs[0], labels=target).loss   # a mean over the counted
        counted = (target != -100).sum()                        # labels, not over the rows
        return loss * counted, counted

    def masked_step(model, inputs, target):             # padding concentrated anywhere
        scores = model(*inputs)
        mask = target != -100
        per_token = torch.nn.functional.cross_entropy(scores, target.clamp(min=0),
                                                      reduction="none")
        return (per_token * mask).sum(), mask.sum()

    DistriOptimizer(model, rdd, optimizer=opt, batch_size=64, training_step=masked_step)

A loss that is a mean over something other than the rows (tokens that are not padding, as a
Hugging Face model's ``.loss``) must come back as ``(loss_sum, normaliser)``: returned as it is,
it would count as a row mean, and a task whose rows hold more padding would weigh its tokens
more. :func:`sparkdl.adapters.huggingface.huggingface_step` does this for Hugging Face models
(causal language models shift their labels by one: their normaliser counts ``target[:, 1:]``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .errors import TrainingStepError

__all__ = ["TrainingStep", "ValidationStep", "step_loss_terms", "step_loss_sums",
           "describe_value"]

TrainingStep = Callable[[torch.nn.Module, Sequence[torch.Tensor], torch.Tensor], Any]
"""``(model, inputs, target) -> mean loss`` or ``(loss_sum, normaliser)``."""

ValidationStep = Callable[[torch.nn.Module, Sequence[torch.Tensor], torch.Tensor], Any]
"""``(model, inputs, target) -> output`` read by the validation metrics."""


def describe_value(value: Any) -> str:
    """A short description of a value for an error message."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} ({value.dtype})"
    return f"a {type(value).__name__}"


def _scalar(value: Any, what: str, need_grad: bool) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TrainingStepError(
            f"The training step must return {what} as a scalar tensor; it returned "
            f"{describe_value(value)}.")
    if value.numel() != 1:
        raise TrainingStepError(
            f"The training step must return {what} as a scalar tensor (one value); it returned "
            f"{describe_value(value)}. Reduce it (a mean over the rows, or return "
            "(loss_sum, normaliser)).")
    if need_grad and torch.is_grad_enabled() and not value.requires_grad:
        raise TrainingStepError(
            f"The training step returned {what} without grad ({describe_value(value)}, "
            "requires_grad=False): compute it from the model's output, without torch.no_grad(), "
            ".detach() or .item().")
    return value.reshape(())


def step_loss_terms(step: TrainingStep, model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                    target: torch.Tensor) -> tuple[torch.Tensor | None, float, float]:
    """``(loss, multiplier, normaliser)`` of one batch under ``step``, in the form of
    :func:`sparkdl.losses.loss_terms`: ``loss * multiplier`` is the loss summed over the batch's
    terms and ``normaliser`` what a single process divides it by. A mean over the rows counts
    each row once (multiplier = normaliser = rows); ``loss`` is None when the normaliser is 0
    (no term counts: the batch contributes nothing)."""
    result = step(model, list(inputs), target)
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise TrainingStepError(
                "The training step must return the mean loss, or a pair (loss_sum, "
                f"normaliser); it returned a {type(result).__name__} of {len(result)} values.")
        normaliser = result[1]
        if isinstance(normaliser, torch.Tensor):
            if normaliser.numel() != 1:
                raise TrainingStepError(
                    "The training step's normaliser must be a number or a scalar tensor; it "
                    f"returned {describe_value(normaliser)}.")
            normaliser = float(normaliser.detach().double())
        elif isinstance(normaliser, (int, float, np.integer, np.floating)) and \
                not isinstance(normaliser, bool):
            normaliser = float(normaliser)
        else:
            raise TrainingStepError(
                "The training step's normaliser must be a number or a scalar tensor; it "
                f"returned {describe_value(normaliser)}.")
        if not (normaliser >= 0 and math.isfinite(normaliser)):
            raise TrainingStepError(
                f"The training step's normaliser must be finite and >= 0; it returned "
                f"{normaliser}.")
        if normaliser == 0:          # no term counts: the rows contribute nothing
            return None, 0.0, 0.0
        return _scalar(result[0], "the loss sum", need_grad=True), 1.0, normaliser
    loss = _scalar(result, "the loss", need_grad=True)
    rows = float(len(target))
    return loss, rows, rows


def step_loss_sums(step: TrainingStep, model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                   target: torch.Tensor) -> np.ndarray:
    """The :class:`sparkdl.metrics.Loss` partial sums ``[loss_sum, normaliser]`` of one
    validation batch under ``step`` (called without grad)."""
    loss, multiplier, normaliser = step_loss_terms(step, model, inputs, target)
    return np.array([0.0 if loss is None else float(loss) * multiplier, normaliser])
