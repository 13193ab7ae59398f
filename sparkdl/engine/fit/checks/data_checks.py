"""Checks of the training and validation data, before the first iteration (driver side).

The data is checked from the per-partition summaries of the shard-building job (no data comes to
the driver but a few samples), and the model and criterion are tried on those samples on the
driver.

Example::

    spec = summarize(train.summaries, "training")      # raises TrainingDataError
    dry_run(model, criterion, spec, "training")        # raises ModelCriterionMismatchError
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ....data.ragged import model_arguments
from ....data.records import mixed_kinds_message, numeric_kind
from ....losses import CLASS_INDEX_LOSSES
from ....errors import (EmptyDataError, InvalidArgumentError, ModelCriterionMismatchError,
                      TrainingDataError, TrainingStepError)
from ....executor.replicas import set_training_modes, training_modes
from ....metrics import Loss, prediction_tensor, uses_step_loss
from ....training_step import step_loss_sums, step_loss_terms
from ....executor.id_checks import IdOrigin, argument_names, checked_ids
from ....executor.shard_store import ShardSummary
from ....executor.step import as_model_input
from ..optim.rng_isolation import private_torch_rng

__all__ = ["DataSpec", "summarize", "dry_run", "sample_batch"]

_SAME_SHAPE_CRITERIA = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss,
                        nn.BCELoss, nn.BCEWithLogitsLoss)


@dataclass
class DataSpec:
    """What the training (or validation) data looks like, from the build job."""

    partition_sizes: list[int]
    feature_shapes: list[tuple[int, ...]]
    feature_dtypes: list[str]
    label_shape: tuple[int, ...]
    label_dtype: str
    label_min: float | None
    label_max: float | None
    sample_features: list[np.ndarray]
    sample_labels: np.ndarray
    sample_partition: int = 0      # the samples are this partition's first records

    @property
    def num_samples(self) -> int:
        return sum(self.partition_sizes)


def summarize(summaries: Sequence[ShardSummary], what: str) -> DataSpec:
    """Check the partitions' summaries against each other and merge them."""
    for s in summaries:
        if s.error and s.error.startswith("mixes int and float"):   # one message, wherever
            raise TrainingDataError(f"The {what} RDD {s.error}")
        if s.error:
            raise TrainingDataError(f"The {what} RDD has a bad record: {s.error}.")
    filled = [s for s in summaries if s.count]
    if not filled:
        raise EmptyDataError(f"The {what} RDD is empty: it has {len(summaries)} partition(s) "
                             "and no (features, label) record.", what)
    first = filled[0]
    for s in filled[1:]:
        for attr, label in (("feature_shapes", "feature shape(s)"),
                            ("label_shape", "label shape")):
            if getattr(s, attr) != getattr(first, attr):
                raise TrainingDataError(
                    f"The {what} RDD has records of inconsistent {label}: partition "
                    f"{first.partition} has {getattr(first, attr)} but partition {s.partition} "
                    f"has {getattr(s, attr)}.")
        _check_kinds(first, s, what)
        if s.feature_dtypes != first.feature_dtypes or s.label_dtype != first.label_dtype:
            raise TrainingDataError(
                f"The {what} RDD mixes numeric types across partitions: partition "
                f"{first.partition} has features {first.feature_dtypes} / labels "
                f"{first.label_dtype}, partition {s.partition} has {s.feature_dtypes} / "
                f"{s.label_dtype}. Make every record's features and label the same type.")
    bad = [s.partition for s in filled if s.feature_nan]
    if bad:
        raise TrainingDataError(f"The {what} RDD has NaN or infinite feature values in "
                                f"partition(s) {bad}.")
    bad = [s.partition for s in filled if s.label_nan]
    if bad:
        raise TrainingDataError(f"The {what} RDD has NaN labels in partition(s) {bad}.")
    mins = [s.label_min for s in filled if s.label_min is not None]
    maxs = [s.label_max for s in filled if s.label_max is not None]
    return DataSpec(
        partition_sizes=[s.count for s in summaries],
        feature_shapes=first.feature_shapes,
        feature_dtypes=first.feature_dtypes,
        label_shape=first.label_shape,
        label_dtype=first.label_dtype,
        label_min=min(mins) if mins else None,
        label_max=max(maxs) if maxs else None,
        sample_features=first.sample_features,
        sample_labels=first.sample_labels if first.sample_labels is not None else np.zeros(0),
        sample_partition=first.partition,
    )


def _check_kinds(first: ShardSummary, other: ShardSummary, what: str) -> None:
    """Int against float features or labels in two partitions: the message a partition mixing
    them gets (:func:`sparkdl.data.records.mixed_kinds_message`)."""
    def where(s: ShardSummary) -> str:
        return f"partition {s.partition}"

    kinds = [numeric_kind(np.dtype(d)) for d in first.feature_dtypes]
    for k, d in enumerate(other.feature_dtypes[:len(kinds)]):
        if numeric_kind(np.dtype(d)) != kinds[k]:
            name = "features" if len(kinds) == 1 else f"input {k} of the features"
            raise TrainingDataError(f"The {what} RDD " + mixed_kinds_message(
                name, where(first), kinds[k], where(other), numeric_kind(np.dtype(d))))
    label_kind, other_kind = (numeric_kind(np.dtype(first.label_dtype)),
                              numeric_kind(np.dtype(other.label_dtype)))
    if label_kind != other_kind:
        raise TrainingDataError(f"The {what} RDD " + mixed_kinds_message(
            "labels", where(first), label_kind, where(other), other_kind))


def _describe(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {tuple(output.shape)} ({output.dtype})"
    return f"a {type(output).__name__}"


def _check_tensor_output(output: torch.Tensor, target: torch.Tensor, criterion: Any,
                         spec: DataSpec, what: str) -> None:
    """The common ways a tensor output and the labels disagree with the criterion."""
    name = type(criterion).__name__
    if isinstance(criterion, CLASS_INDEX_LOSSES) and target.dtype == torch.int64:
        if output.ndim < 2:
            raise ModelCriterionMismatchError(
                f"{name} needs a model output of shape (batch, classes); the model returns "
                f"{tuple(output.shape)}.")
        classes = output.shape[1]
        ignore = getattr(criterion, "ignore_index", None)
        lo, hi = spec.label_min, spec.label_max
        if (lo is not None and lo < 0 and lo != ignore) or (hi is not None and hi >= classes):
            raise TrainingDataError(
                f"The {what} labels must be class indices in 0..{classes - 1} for {name} (the "
                f"model has {classes} outputs); they range from {lo:g} to {hi:g}.")
    if isinstance(criterion, _SAME_SHAPE_CRITERIA) and tuple(output.shape) != tuple(target.shape):
        raise ModelCriterionMismatchError(
            f"{name} needs the model output and the label to have the same shape; the model "
            f"returns {tuple(output.shape)} for labels of shape {tuple(target.shape)}. Reshape the "
            "labels in the RDD or the output in the model.")


def dry_run(model: nn.Module, criterion: Any, spec: DataSpec, what: str,
            metrics: Sequence[Any] = (), dtype: torch.dtype | None = None,
            arguments: Any = None, steps: tuple[Any, Any] = (None, None),
            prediction: bool = False, names: Sequence[str] | None = None,
            collate: Any = None) -> None:
    """Run a copy of the model, the criterion and the validation ``metrics`` on a few real
    samples (floating inputs in ``dtype``, the model's parameter dtype); explain any mismatch.

    The model may return anything the criterion accepts (a tensor, a tuple, a dict); the shape
    checks apply when it returns a tensor. ``steps`` are the run's training and validation
    steps (:mod:`sparkdl.training_step`): the training step is tried with grad, in the modes
    the tasks train in, and must return a scalar loss with grad or ``(loss_sum, normaliser)``;
    the metrics read the validation step's output. ``prediction``: with a training step,
    ``model(*inputs)`` must still give predictions (a tensor, or a dict-like output with
    ``"logits"``), as the estimators' ``transform`` reads them. Embedding ids out of their
    table's range raise :class:`TrainingDataError` (:mod:`sparkdl.executor.id_checks`), naming
    the input (``names``: the features' columns; none under a ``collate``, the run's) and the
    record. A model whose frozen weights are on the meta device (a pretrained base the driver
    does not hold) is not run here: its tasks' first step reports what does not fit."""
    if any(p.is_meta for p in model.parameters()):
        return
    probe = copy.deepcopy(model)
    inputs, target = sample_batch(spec, dtype, arguments)
    # sample weights, the last feature, are no model argument: the names before them hold
    origin = IdOrigin(argument_names(spec.sample_features, names, collate),
                      spec.sample_partition, np.arange(len(spec.sample_labels)), what)
    with private_torch_rng(), checked_ids(probe, inputs, origin):   # a dropout layer must not
        _dry_run(probe, criterion, spec, what, metrics, dtype, arguments, steps,  # draw from
                 prediction, (inputs, target))                          # the caller's RNG


def _try_training_step(probe: nn.Module, step: Any, inputs: list[torch.Tensor],
                       target: torch.Tensor, shapes: str) -> None:
    """The training step on the samples, as a task runs it: an error names what it returned."""
    modes = training_modes(probe)
    set_training_modes(probe, modes)
    try:
        step_loss_terms(step, probe, inputs, target)
    except (TrainingStepError, TrainingDataError):
        raise
    except Exception as exc:
        raise TrainingStepError(
            f"The training step cannot run on the training rows: features of shape(s) {shapes} "
            f"and labels of shape {tuple(target.shape)} ({target.dtype}) raised "
            f"{type(exc).__name__}: {exc}") from exc
    finally:
        probe.zero_grad(set_to_none=True)
        probe.eval()


def sample_batch(spec: DataSpec, dtype: torch.dtype | None, arguments: Any = None
                 ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The data's sample rows as the model takes them: ``(inputs, target)`` (floating values
    in ``dtype``; ``arguments`` turns the stored features into model arguments)."""
    args = (arguments(list(spec.sample_features)) if arguments is not None
            else model_arguments(spec.sample_features))
    return [as_model_input(f, dtype) for f in args], as_model_input(spec.sample_labels, dtype)


def _dry_run(probe: nn.Module, criterion: Any, spec: DataSpec, what: str,
             metrics: Sequence[Any], dtype: torch.dtype | None, arguments: Any,
             steps: tuple[Any, Any] = (None, None), prediction: bool = False,
             batch: tuple[list[torch.Tensor], torch.Tensor] | None = None) -> None:
    # batch: the very tensors the id checks know the inputs by
    inputs, target = batch if batch is not None else sample_batch(spec, dtype, arguments)
    shapes = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in inputs)
    training_step, validation_step = steps
    if training_step is not None:
        if what == "training":
            _try_training_step(probe, training_step, inputs, target, shapes)
        if prediction:
            _check_prediction(probe, inputs, shapes)
        _dry_run_metrics(probe, criterion, training_step, validation_step, inputs, target,
                         metrics, shapes, what)
        return
    try:
        with torch.no_grad():
            output = probe(*inputs)
    except TrainingDataError:   # an id out of its table's range
        raise
    except Exception as exc:
        raise ModelCriterionMismatchError(
            f"The model cannot run on the {what} features: a batch of features of shape(s) "
            f"{shapes} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(output, torch.Tensor):
        _check_tensor_output(output, target, criterion, spec, what)
    name = type(criterion).__name__
    try:
        with torch.no_grad():
            loss = criterion(output, target)
    except TrainingDataError:   # an id out of its table's range
        raise
    except Exception as exc:
        raise ModelCriterionMismatchError(
            f"The model output, {_describe(output)}, does not fit {name} with labels of shape "
            f"{tuple(target.shape)} ({target.dtype}): {type(exc).__name__}: {exc}") from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ModelCriterionMismatchError(
            f"The criterion must return a scalar loss; {name} returned "
            f"{getattr(loss, 'shape', type(loss).__name__)}.")
    _dry_run_metrics(probe, criterion, None, validation_step, inputs, target, metrics, shapes,
                     what, output)


def _check_prediction(probe: nn.Module, inputs: list[torch.Tensor], shapes: str) -> None:
    """``model(*inputs)`` (eval mode, no grad) gives a prediction tensor (:func:`prediction_tensor`)."""
    probe.eval()
    try:
        with torch.no_grad():
            output = prediction_tensor(probe(*inputs))
    except TrainingDataError:   # an id out of its table's range
        raise
    except Exception as exc:
        raise ModelCriterionMismatchError(
            f"transform calls model(*inputs), which fails on features of shape(s) {shapes}: "
            f"{type(exc).__name__}: {exc}. Give the inputs in the order of the model's "
            "forward.") from exc
    if not isinstance(output, torch.Tensor):
        raise ModelCriterionMismatchError(
            f"transform reads the predictions of model(*inputs), which returns "
            f"{_describe(output)}: return a tensor (or a dict-like output with 'logits') when "
            "the model is called without labels.")


def _validation_output(probe: nn.Module, validation_step: Any, inputs: list[torch.Tensor],
                       target: torch.Tensor, shapes: str, what: str) -> Any:
    """What validation's metrics read: the validation step's output, else the model's."""
    with torch.no_grad():
        if validation_step is not None:
            try:
                return validation_step(probe, inputs, target)
            except TrainingDataError:   # an id out of its table's range
                raise
            except Exception as exc:
                raise ModelCriterionMismatchError(
                    f"The validation step cannot run on the {what} rows (features of shape(s) "
                    f"{shapes}): {type(exc).__name__}: {exc}") from exc
        try:
            return probe(*inputs)
        except TrainingDataError:   # an id out of its table's range
            raise
        except Exception as exc:
            raise ModelCriterionMismatchError(
                f"The model cannot run on the {what} features: a batch of features of "
                f"shape(s) {shapes} raised {type(exc).__name__}: {exc}") from exc


def _dry_run_metrics(probe: nn.Module, criterion: Any, training_step: Any, validation_step: Any,
                     inputs: list[torch.Tensor], target: torch.Tensor, metrics: Sequence[Any],
                     shapes: str, what: str, output: Any = None) -> None:
    """The validation metrics on the samples, in eval mode, reading what validation computes:
    the validation step's output, else the model's (``output`` when already computed); not
    computed when every metric is the training step's loss."""
    if not metrics:
        return
    probe.eval()
    needs_output = not all(uses_step_loss(m, criterion, training_step) for m in metrics)
    if needs_output and (validation_step is not None or output is None):
        output = _validation_output(probe, validation_step, inputs, target, shapes, what)
    for metric in metrics:
        if isinstance(metric, Loss) and metric.criterion is None and criterion is None \
                and training_step is None:
            raise InvalidArgumentError(
                "The validation metric Loss has no criterion: the run has none. Pass "
                "Loss(criterion=...), a criterion, or a training_step (whose loss it then is).")
        try:
            with torch.no_grad():
                if uses_step_loss(metric, criterion, training_step):
                    step_loss_sums(training_step, probe, inputs, target)
                else:
                    metric.partial(output, target, criterion)
        except TrainingDataError:   # an id out of its table's range
            raise
        except Exception as exc:
            raise ModelCriterionMismatchError(
                f"The validation metric {metric.name} cannot read the "
                f"{'validation step' if validation_step is not None else 'model'} output "
                f"({_describe(output)}): {type(exc).__name__}: {exc}") from exc
