"""A Hugging Face ``transformers`` model trained with the loss it computes itself.

:func:`huggingface_step` gives a training step that calls the model with its inputs by name and
the batch's labels as ``labels=``, and reads the ``loss`` of its output (a ``ModelOutput``, a
dict, or a tuple whose first element is the loss). Hugging Face losses over class indices
(sequence and token classification, language modelling) are means over the labels that are not
``-100``; the step returns them as ``(loss * counted, counted)`` so that padding concentrated in
some partitions stays exact (:mod:`sparkdl.training_step`). Float labels (regression,
multi-label) give the mean over the rows.

For validation and ``transform`` sparkdl calls ``model(*inputs)`` positionally: give the inputs
in the order of the model's ``forward`` (``input_ids``, ``attention_mask``, ...); the metrics read
the output's ``logits``. Models are built from a config (``BertConfig(...)``) or loaded by the
user; nothing is downloaded by sparkdl.

Example::

    from transformers import BertConfig, BertForSequenceClassification
    model = BertForSequenceClassification(BertConfig(vocab_size=1000, hidden_size=64,
                                                     num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=128, num_labels=2))
    NNClassifier(model=model, trainingStep=huggingface_step(("input_ids", "attention_mask")),
                 inputCols=["input_ids", "attention_mask"], labelCol="label", maxEpoch=3)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..errors import TrainingStepError
from ..losses import IGNORE_INDEX

__all__ = ["HuggingFaceStep", "huggingface_step"]

_SHIFTING_HEADS = ("ForCausalLM", "LMHeadModel")
"""Model class name endings whose loss shifts the labels by one (causal language models)."""


class HuggingFaceStep:
    """A training step calling ``model(**inputs_by_name, labels=target)`` and returning its loss
    (see the module docstring). Picklable: it ships to the executors with the run."""

    def __init__(self, input_names: Sequence[str], shift_labels: bool | None = None,
                 ignore_index: int = IGNORE_INDEX) -> None:
        names = [input_names] if isinstance(input_names, str) else list(input_names)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise TrainingStepError(f"input_names must name the model's inputs, e.g. "
                                    f"('input_ids', 'attention_mask'); got {input_names!r}.")
        self.input_names = tuple(names)
        self.shift_labels = None if shift_labels is None else bool(shift_labels)
        self.ignore_index = int(ignore_index)

    def __call__(self, model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                 target: torch.Tensor) -> Any:
        if len(inputs) != len(self.input_names):
            raise TrainingStepError(
                f"huggingface_step names {len(self.input_names)} input(s) "
                f"{list(self.input_names)} but the rows give the model {len(inputs)}: name one "
                "per input column, in order.")
        output = model(**dict(zip(self.input_names, inputs)), labels=target)
        loss = _loss(output)
        if target.is_floating_point():
            return loss
        shift = self.shift_labels
        if shift is None:     # a peft model shifts as the model it wraps
            base = getattr(model, "get_base_model", None)
            shift = type(base() if callable(base) else model).__name__.endswith(_SHIFTING_HEADS)
        counted = target[..., 1:] if shift else target
        normaliser = (counted != self.ignore_index).sum()
        return loss * normaliser, normaliser

    def __repr__(self) -> str:
        return f"huggingface_step({self.input_names!r})"


def _loss(output: Any) -> Any:
    if isinstance(output, dict) or hasattr(output, "keys"):
        if "loss" not in output or output["loss"] is None:
            raise TrainingStepError(
                "The Hugging Face model returned no loss for labels=: use a model with a head "
                "that computes one (e.g. ...ForSequenceClassification, ...ForCausalLM).")
        return output["loss"]
    if isinstance(output, (tuple, list)) and output:
        return output[0]
    return output


def huggingface_step(input_names: Sequence[str] = ("input_ids",),
                     shift_labels: bool | None = None,
                     ignore_index: int = IGNORE_INDEX) -> HuggingFaceStep:
    """A training step for a Hugging Face model that computes its own loss from ``labels=``.

    Args:
        input_names: the model's keyword argument for each input, in the order of the rows'
            inputs (the estimators' ``inputCols``), e.g. ``("input_ids", "attention_mask")``.
        shift_labels: the model shifts the labels by one before its loss, so the first
            position of each row never counts; None (default): when the model's class name
            ends with ``ForCausalLM`` or ``LMHeadModel`` (causal language models).
        ignore_index: the label the model's loss ignores (Hugging Face's default, -100).

    Example::

        DistriOptimizer(model, rdd, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                        batch_size=32, training_step=huggingface_step(("input_ids",)))
    """
    return HuggingFaceStep(input_names, shift_labels, ignore_index)
