"""Validation metrics, computed as partial sums on the executors and combined on the driver.

Each metric turns one batch of model output and labels into a small vector of sums
(:meth:`ValidationMetric.partial`); the driver adds the vectors of all partitions, in partition
order, and :meth:`ValidationMetric.result` turns the total into the reported number. So a metric
over the whole validation set costs one small record per partition.

A model may return anything its criterion accepts (a tensor, a tuple, a dict such as a Hugging
Face output). :class:`Loss` hands the output to the criterion as is; metrics that need a tensor
(:class:`Top1Accuracy`, :class:`MAE`) take ``select``, a function from the model's output to
that tensor.

Example::

    from sparkdl.metrics import Top1Accuracy, Loss, MAE
    opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy(), Loss()])
    Top1Accuracy(select=lambda out: out["logits"])      # a model returning a dict
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from .argument_checks import argument_error
from .losses import has_normaliser, loss_terms

__all__ = ["ValidationMetric", "Top1Accuracy", "Loss", "MAE", "one_output_threshold",
           "threshold_warning", "uses_step_loss", "prediction_tensor"]


Select = Callable[[Any], torch.Tensor]


def _check_select(owner: str, select: Any) -> Select | None:
    if select is not None and not callable(select):
        raise argument_error("select", owner, "None or a function from the model's output to a "
                             "tensor", select)
    return select


def prediction_tensor(output: Any) -> Any:
    """The scores in a model's output: the output itself when it is a tensor, the ``"logits"``
    entry of a dict-like output (a Hugging Face ``ModelOutput``), else the output unchanged."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    return output


class ValidationMetric:
    """Base class of validation metrics."""

    name = "metric"
    select: Select | None = None

    def tensor(self, output: Any) -> torch.Tensor:
        """The tensor this metric reads from the model's output: ``select`` applied, else
        :func:`prediction_tensor`."""
        out = self.select(output) if self.select is not None else prediction_tensor(output)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{type(self).__name__} needs a tensor of model outputs, but "
                            f"{'select returned' if self.select else 'the model returns'} "
                            f"{type(out).__name__}: pass select=, e.g. "
                            f"{type(self).__name__}(select=lambda out: out['logits'])")
        return out

    def partial(self, output: Any, target: torch.Tensor, criterion: Any
                ) -> np.ndarray:  # pragma: no cover - abstract
        """Sums over one batch (float64 vector of fixed length)."""
        raise NotImplementedError

    def result(self, total: np.ndarray) -> float:
        """The metric from the sums over all batches: by default sum / count."""
        return float(total[0] / total[1]) if total[1] else float("nan")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Top1Accuracy(ValidationMetric):
    """Share of samples whose highest-scoring class is the label.

    With one output column, the prediction is ``output > threshold``. One rule everywhere (the
    engine, the estimators' ``"accuracy"``, ``transform``'s prediction): by default the output is
    a logit (threshold 0.0), except under ``torch.nn.BCELoss``, which takes probabilities
    (threshold 0.5); pass ``threshold`` to choose. A model ending in ``Sigmoid`` trained with
    another loss gets a warning (:func:`threshold_warning`). ``select`` picks the scores from a model
    output that is not a tensor.
    """

    name = "Top1Accuracy"

    def __init__(self, threshold: float | None = None, select: Select | None = None) -> None:
        self.threshold = None if threshold is None else float(threshold)
        self.select = _check_select("Top1Accuracy", select)

    def partial(self, output: Any, target: torch.Tensor, criterion: Any) -> np.ndarray:
        output = self.tensor(output)
        if output.ndim == 1 or output.shape[-1] == 1:
            threshold = (self.threshold if self.threshold is not None
                         else one_output_threshold(criterion))
            predicted = (output.reshape(-1) > threshold).long()
        else:
            predicted = output.argmax(dim=-1)
        target = target.reshape(predicted.shape).long()
        return np.array([float((predicted == target).sum()), float(target.numel())])


def one_output_threshold(criterion: Any) -> float:
    """Where a one-output classifier's output turns into class 1: 0.5 for ``BCELoss`` (its
    inputs are probabilities), else 0.0 (a logit)."""
    return 0.5 if isinstance(criterion, torch.nn.BCELoss) else 0.0


def _last_layers(model: torch.nn.Module) -> tuple[torch.nn.Module | None, int | None]:
    """The model's last layer (its last registered module without children) and the output
    width of its last layer that has one (``out_features``), or None."""
    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    widths = [m.out_features for m in leaves if isinstance(getattr(m, "out_features", None), int)]
    return (leaves[-1] if leaves else None), (widths[-1] if widths else None)


def threshold_warning(metrics: Sequence[ValidationMetric], model: torch.nn.Module,
                      criterion: Any) -> str | None:
    """Why :class:`Top1Accuracy`'s default threshold is likely wrong for this run, or None.

    The rule (:func:`one_output_threshold`) takes a one-output model's output as a logit
    (threshold 0.0) unless the loss is ``BCELoss``. A model whose last layer is a ``Sigmoid``
    outputs probabilities, all above 0.0, so under any other loss (``MSELoss``, a training
    step) every sample would count as class 1. The rule is kept (the estimators' ``transform``
    predicts by it too); the run is warned, naming the layer and the loss."""
    if not any(isinstance(m, Top1Accuracy) and m.threshold is None for m in metrics):
        return None
    if isinstance(criterion, torch.nn.BCELoss):
        return None
    last, width = _last_layers(model)
    if not isinstance(last, torch.nn.Sigmoid) or (width is not None and width != 1):
        return None
    loss = (type(criterion).__name__ if criterion is not None
            else "no criterion (a training step)")
    return (f"Top1Accuracy: the model's last layer is {type(last).__name__} (its one output is "
            f"a probability) and it is trained with {loss}, so the class-1 threshold is "
            f"{one_output_threshold(criterion)} (the output taken as a logit) and every sample "
            "counts as class 1. Pass Top1Accuracy(threshold=0.5), or drop the final Sigmoid "
            "and train with torch.nn.BCEWithLogitsLoss.")


class Loss(ValidationMetric):
    """The criterion's mean over the validation samples (or the given ``criterion``); in a run
    with a ``training_step`` and no criterion, the step's loss (:mod:`sparkdl.training_step`)."""

    name = "Loss"

    def __init__(self, criterion: Any = None) -> None:
        self.criterion = criterion

    def partial(self, output: Any, target: torch.Tensor, criterion: Any) -> np.ndarray:
        crit = self.criterion if self.criterion is not None else criterion
        if crit is None:
            raise TypeError("Loss() has no criterion: pass Loss(criterion=...) or give the run "
                            "a criterion or a training_step")
        if isinstance(crit, torch.nn.Module):
            crit = crit.to(target.device)
        if has_normaliser(crit):    # masked or class-weighted: the mean over the union
            loss, multiplier, normaliser = loss_terms(crit, output, target)
            return np.array([0.0 if loss is None else float(loss) * multiplier, normaliser])
        value = float(crit(output, target))
        n = float(target.shape[0])
        if getattr(crit, "reduction", "mean") == "sum":
            return np.array([value, n])
        return np.array([value * n, n])


def uses_step_loss(metric: ValidationMetric, criterion: Any, training_step: Any) -> bool:
    """Whether ``metric`` is a :class:`Loss` served by the training step (no criterion given to
    the metric or the run): the step's loss over the validation rows
    (:func:`sparkdl.training_step.step_loss_sums`)."""
    return (isinstance(metric, Loss) and metric.criterion is None and criterion is None
            and training_step is not None)


class MAE(ValidationMetric):
    """Mean absolute error over all output elements (regression); ``select`` picks the
    predictions from a model output that is not a tensor."""

    name = "MAE"

    def __init__(self, select: Select | None = None) -> None:
        self.select = _check_select("MAE", select)

    def partial(self, output: Any, target: torch.Tensor, criterion: Any) -> np.ndarray:
        output = self.tensor(output)
        out = output.reshape(target.shape) if output.numel() == target.numel() else output
        diff = (out.double() - target.double()).abs()
        return np.array([float(diff.sum()), float(diff.numel())])
