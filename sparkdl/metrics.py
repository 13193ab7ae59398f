"""Validation metrics, computed as partial sums on the executors and combined on the driver.

Each metric turns one batch of model output and labels into a small vector of sums
(:meth:`ValidationMetric.partial`); the driver adds the vectors of all partitions, in partition
order, and :meth:`ValidationMetric.result` turns the total into the reported number. So a metric
over the whole validation set costs one small record per partition.

Example::

    from sparkdl.metrics import Top1Accuracy, Loss, MAE
    opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy(), Loss()])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["ValidationMetric", "Top1Accuracy", "Loss", "MAE"]


class ValidationMetric:
    """Base class of validation metrics."""

    name = "metric"

    def partial(self, output: torch.Tensor, target: torch.Tensor, criterion: Any
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

    With one output column, the prediction is ``output > threshold`` (0.5 by default: a
    probability; pass ``threshold=0.0`` for logits).
    """

    name = "Top1Accuracy"

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = float(threshold)

    def partial(self, output: torch.Tensor, target: torch.Tensor, criterion: Any) -> np.ndarray:
        if output.ndim == 1 or output.shape[-1] == 1:
            predicted = (output.reshape(-1) > self.threshold).long()
        else:
            predicted = output.argmax(dim=-1)
        target = target.reshape(predicted.shape).long()
        return np.array([float((predicted == target).sum()), float(target.numel())])


class Loss(ValidationMetric):
    """The criterion's mean over the validation samples (or the given ``criterion``)."""

    name = "Loss"

    def __init__(self, criterion: Any = None) -> None:
        self.criterion = criterion

    def partial(self, output: torch.Tensor, target: torch.Tensor, criterion: Any) -> np.ndarray:
        crit = self.criterion if self.criterion is not None else criterion
        value = float(crit(output, target))
        n = float(output.shape[0])
        if getattr(crit, "reduction", "mean") == "sum":
            return np.array([value, n])
        return np.array([value * n, n])


class MAE(ValidationMetric):
    """Mean absolute error over all output elements (regression)."""

    name = "MAE"

    def partial(self, output: torch.Tensor, target: torch.Tensor, criterion: Any) -> np.ndarray:
        out = output.reshape(target.shape) if output.numel() == target.numel() else output
        diff = (out.double() - target.double()).abs()
        return np.array([float(diff.sum()), float(diff.numel())])
