"""What one task computes on its partition's shard (executor side; also called in process).

:func:`compute_gradient` draws the partition's share of the global batch, loads the broadcast
state (:class:`sparkdl.transport.flat_layout.ParamLayout`) into the replica, runs forward and
backward (optionally in micro-batches) and returns the flat vector
``(|B_i| / |B|) * grad of the mean loss on B_i``, so that the sum of these vectors over all
partitions is exactly the gradient on the union batch ``B``; its report says which parameters
got a gradient and carries the raw bytes of the buffers it changed (the driver combines them by
:func:`sparkdl.transport.flat_layout.combine_buffers`). :func:`compute_metric_sums` computes validation
metric sums over a whole partition. Neither knows how it was reached (a Spark task, a plain call):
:mod:`sparkdl.executor.tasks` wraps them for Spark.

Example::

    vector, report = compute_gradient(step, partition, shard, lambda s: replica, state)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..data.batch_plan import task_seed, transform_generator
from ..data.ragged import Ragged, model_arguments
from ..errors import InvalidArgumentError, SparkdlError
from ..losses import loss_terms
from ..training_step import step_loss_sums, step_loss_terms
from ..transport.table_rows import Rows, sum_rows
from ..transport.weight_refresh import Refresh, sync_replica
from ..metrics import ValidationMetric, uses_step_loss
from .daemon_exit import quiet_closed_socket_once
from .id_checks import IdOrigin, argument_names, checked_ids
from .process_memory import current_rss_bytes
from .replicas import Replica, set_training_modes
from .shard_store import Shard
from .sub_replicas import run_sub_replicas, sub_shares

__all__ = ["StepSpec", "TaskReport", "PartitionMetrics", "compute_gradient", "compute_metric_sums",
           "set_task_threads", "seed_task", "as_model_input", "autocast", "chunk_loss"]


@dataclass(frozen=True)
class StepSpec:
    """One iteration's instructions to every task (small; shipped in the job's closure):
    which samples each partition takes and how to weight them."""

    seed: int
    shuffle: bool
    iteration: int
    epoch: int
    starts: np.ndarray
    counts: np.ndarray
    batch_size: int
    micro_batch_size: int | None
    layout_fingerprint: str = ""
    device: str = "cpu"          # the requested device rule: "auto", "cpu" or "cuda"
    precision: str = "32"        # "32", "bf16-mixed" or "16-mixed"
    loss_scale: float = 1.0      # the global loss scale of "16-mixed"
    sub_replicas: int = 1        # the share computed on this many sub-replicas in threads


@dataclass
class TaskReport:
    """What a task tells the driver besides its gradient."""

    partition: int
    count: int = 0
    loss: float = 0.0          # this task's part of the batch loss, already weighted
    compute_s: float = 0.0
    missing_shard: bool = False
    attempt: int = 0
    rss_bytes: int = 0         # the Python worker's resident memory after the task
    started_at: float = 0.0    # wall clock (time.time()) when the task's function began
    finished_at: float = 0.0   # ... and when its vector was ready
    grad_present: np.ndarray | None = None   # per trainable parameter: 1 if it got a gradient
    buffers: dict[int, bytes] = field(default_factory=dict)   # raw bytes of changed buffers
    device: str = "cpu"        # where it computed, and why
    fatal: tuple[str, str] | None = None   # a permanent error (class name, message): no retry
    normaliser: float = 0.0    # the loss's normaliser over this task's rows, when the driver
    # divides (sample weights: the sum of the weights; masked or class-weighted losses: the
    # count or weight of the targets, sparkdl.losses); 0 when the task weighted by rows
    table_rows: dict[int, Rows] | None = None   # the embedding tables' gradient rows, by
    # parameter index (sparkdl.transport.table_rows); the shuffle moves them into its blocks
    full_read: bool = False    # the replica read the full weights (new, restarted or evicted)
    executor: str = ""         # where it ran, "executor_<host>_<id>" ("" if unknown)


@dataclass(frozen=True)
class PartitionMetrics:
    """One partition's validation sums (None when its data was not found) and sample count;
    ``fatal``: the permanent error its task met (class name, message), reported in place of
    being raised so that Spark does not retry it (:func:`sparkdl.errors.permanent_report`)."""

    partition: int
    sums: list[np.ndarray] | None
    count: int
    fatal: tuple[str, str] | None = None


def set_task_threads(sub_replicas: int = 1) -> None:
    """Use as many torch threads as Spark gave the task cores (``spark.task.cpus``), shared
    among ``sub_replicas`` sub-replicas running at once (at least one each). Every sparkdl
    task that computes calls it first; it also makes the worker end quietly once the JVM has
    closed its socket (:func:`~sparkdl.executor.daemon_exit.quiet_closed_socket_once`)."""
    from pyspark import TaskContext

    quiet_closed_socket_once()

    ctx = TaskContext.get()
    cpus = ctx.cpus() if ctx is not None else 1
    threads = max(1, int(cpus) // max(1, int(sub_replicas)))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def seed_task(seed: int, device: str) -> None:
    """Seed the task's torch generators: the CPU's always, CUDA's unless the task computes on
    the CPU (``device``: where it computes, ``"cpu"`` or ``"cuda:N"``, or the rule of
    :attr:`StepSpec.device` when that is not known) or no GPU is visible.

    The same streams as ``torch.manual_seed``, without its cost in a CPU worker: there it
    defers a seeding for each accelerator backend not yet initialised, capturing a stack trace
    for each (2.5 ms per call in a Spark worker's deep stack: 40 ms of a 16-fit pass's task)."""
    torch.default_generator.manual_seed(seed)
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)      # deferred until CUDA starts, as before


_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """The autocast context of ``precision`` on ``device`` (disabled for "32")."""
    dtype = _AUTOCAST.get(precision)
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def as_model_input(a: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """``a`` (a tensor, or an array, taken without a copy when it is writable) as a model with
    parameters of ``dtype`` takes it: floating values in that dtype (bfloat16 data is stored as
    float32, which numpy can hold), integers (ids) as they are; ``dtype`` None: as it is."""
    if not isinstance(a, torch.Tensor):
        array = np.asarray(a)
        a = torch.from_numpy(array if array.flags.writeable else array.copy())
    if dtype is not None and a.is_floating_point() and a.dtype != dtype:
        return a.to(dtype)
    return a


def _to_tensors(features: Sequence[Any], labels: np.ndarray, dtype: torch.dtype,
                device: torch.device, replica: Any = None
                ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Tensors of a batch on ``device``, as the model takes them (:func:`as_model_input`;
    sequences padded, or the replica's ``collate``: :func:`sparkdl.data.ragged.model_arguments`)."""
    def tensor(a: Any) -> torch.Tensor:
        t = as_model_input(a, dtype)
        return t.to(device, non_blocking=True) if device.type != "cpu" else t

    args = model_arguments(features, getattr(replica, "padding_value", 0.0),
                           getattr(replica, "collate", None))
    return [tensor(f) for f in args], tensor(labels)


def _check_layout(step: StepSpec, replica: Replica) -> None:
    if step.layout_fingerprint and step.layout_fingerprint != replica.layout.fingerprint:
        raise SparkdlError(
            f"The model replica on this executor is laid out differently (fingerprint "
            f"{replica.layout.fingerprint}) from the driver's model ({step.layout_fingerprint}): "
            "its parameters, buffers, dtypes or requires_grad flags differ. Do not change the "
            "model while it trains.")


def apply_transform(transform: Callable[..., Any], features: list[np.ndarray],
                    rng: np.random.Generator) -> list[np.ndarray]:
    """``transform(batch, rng)`` on a task's training batch: the array itself for a one-input
    model, the list of arrays (one per input) otherwise; the result must keep the number of
    rows."""
    single = len(features) == 1
    out = transform(features[0] if single else list(features), rng)
    out = [out] if single else list(out)
    if len(out) != len(features) or any(len(o) != len(f) for o, f in zip(out, features)):
        raise ValueError("train_transform must return "
                         + ("an array" if single else f"a list of {len(features)} arrays")
                         + f" with {len(features[0])} rows, the batch it was given")
    return [o if isinstance(o, Ragged) else np.asarray(o) for o in out]


def _chunks(indices: np.ndarray, size: int | None) -> list[np.ndarray]:
    if not size or size >= len(indices):
        return [indices]
    return [indices[k:k + size] for k in range(0, len(indices), size)]


def compute_gradient(step: StepSpec, partition: int, shard: Shard | None,
                     replica_of: Callable[[int], Replica], weights: np.ndarray | Refresh,
                     attempt: int = 0, device: str | None = None
                     ) -> tuple[np.ndarray | None, TaskReport]:
    """The weighted local gradient of ``partition`` (None when it has no share); the report
    says which parameters got a gradient and carries the buffers the task changed.

    ``shard`` is None when the partition's data is not where this task runs (reported as
    ``missing_shard``); ``replica_of(s)`` gives sub-replica ``s`` (only called when there is
    work). ``weights``: the whole state, or a :class:`Refresh` that brings the replica's own
    copy to the driver's version (:mod:`sparkdl.transport.weight_refresh`). With
    ``device``: where the replicas compute (``"cpu"``, ``"cuda:N"``; None: by the rule of
    ``step.device``), for seeding. With ``step.sub_replicas`` > 1 the share is split into that many contiguous parts
    computed concurrently on sub-replicas 0, 1, ... and their vectors summed in that order
    (:mod:`sparkdl.executor.sub_replicas`).
    """
    report = TaskReport(partition=partition, attempt=attempt, started_at=time.time())
    count = int(step.counts[partition])
    report.count = count
    if count == 0:
        return None, report
    if shard is None:
        report.missing_shard = True
        return None, report
    t0 = time.perf_counter()
    seed_task(task_seed(step.seed, step.iteration, partition), device or step.device)
    start = int(step.starts[partition])
    indices = shard.permutation(step.seed, step.epoch, partition, step.shuffle)[start:start + count]
    parts = [(s, part) for s, part in enumerate(sub_shares(indices, step.sub_replicas))
             if len(part)]                    # one part, the whole share, without sub-replicas
    results = run_sub_replicas([
        (lambda s=s, part=part: _share_gradient(step, partition, shard, replica_of(s), part,
                                                weights, len(parts) == 1)) for s, part in parts])
    vector, present, loss, normaliser, report.buffers, rows, _ = results[0]
    report.full_read = any(result[6] for result in results)
    for more, more_present, more_loss, more_normaliser, _, more_rows, _ in results[1:]:
        vector += more                                       # in sub-replica order
        present = np.maximum(present, more_present)
        loss, normaliser = loss + more_loss, normaliser + more_normaliser
        rows = {k: sum_rows([rows.get(k), more_rows.get(k)], vector.dtype)
                for k in sorted(set(rows) | set(more_rows))}
    report.table_rows = rows or None
    changed = [s for (s, _), result in zip(parts, results) if result[4]]
    if len(parts) > 1 and changed:
        raise InvalidArgumentError(
            f"Sub-replica {changed[0]} of partition {partition} changed buffers of the "
            "model (BatchNorm statistics, say): sub-replicas cannot combine buffers. Use "
            "sub_replicas=1 (subReplicas=1): one replica with intra-op threads.")
    report.grad_present, report.loss, report.normaliser = present, loss, normaliser
    report.compute_s = time.perf_counter() - t0
    report.rss_bytes = current_rss_bytes()
    report.finished_at = time.time()
    return vector, report


def chunk_loss(replica: Replica, shard: Shard, chunk: np.ndarray, precision: str,
               partition: int, rng: np.random.Generator | None
               ) -> tuple[torch.Tensor | None, float, float]:
    """The forward of ``chunk`` (local indices of the partition's shard) on the replica's
    model: ``(loss, multiplier, normaliser)`` as :func:`sparkdl.losses.loss_terms` gives them
    for a training step, a loss with a normaliser and sample weights (``loss * multiplier``
    the loss summed over the chunk's terms; loss None when no term counts); the plain loss
    with multiplier and normaliser 0 otherwise (the caller weights it by rows). The
    ``train_transform`` draws from ``rng``."""
    model = replica.model
    features, labels = shard.take(chunk)
    if replica.sample_weights:
        features, sample_weights = features[:-1], features[-1]
    if replica.train_transform is not None:
        features = apply_transform(replica.train_transform, features, rng)
    inputs, target = _to_tensors(features, labels, replica.layout.param_dtype, replica.device,
                                 replica)
    origin = IdOrigin(argument_names(features, replica.input_names, replica.collate),
                      partition, chunk)
    multiplier, normaliser = 0.0, 0.0
    with autocast(precision, replica.device), checked_ids(model, inputs, origin):
        if replica.training_step is not None:       # the user's own step (its own calls)
            loss, multiplier, normaliser = step_loss_terms(replica.training_step, model,
                                                           inputs, target)
        elif replica.normalised:    # divided by the union's normaliser
            loss, multiplier, normaliser = loss_terms(replica.criterion, model(*inputs), target)
        elif replica.sample_weights:
            loss = replica.per_sample_criterion(model(*inputs), target)
        else:
            loss = replica.criterion(model(*inputs), target)
    if replica.sample_weights:
        # sum of w_i * loss_i, divided by the union's sum of w
        per_sample = loss.reshape(loss.shape[0], -1).mean(1)
        loss = (per_sample * torch.from_numpy(np.asarray(sample_weights)).to(
            per_sample.device, per_sample.dtype)).sum()
        multiplier, normaliser = 1.0, float(np.sum(sample_weights, dtype=np.float64))
    return loss, multiplier, normaliser


def _share_gradient(step: StepSpec, partition: int, shard: Shard, replica: Replica,
                    indices: np.ndarray, weights: np.ndarray | Refresh, alone: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, float, float, dict[int, bytes],
                               dict[int, Rows], bool]:
    """One replica's forward and backward over ``indices`` of the partition (in micro-batches):
    its flat vector, the parameters present, its weighted loss, its normaliser, the buffers
    it changed, its sparse gradients' rows and whether it read the full weights. ``alone``: no
    other sub-replica of the task reads the weights, so once they are in the model the task
    drops its copy of the full state (the replica keeps none without row-local tables) rather
    than hold a second model-sized object through the backward pass."""
    _check_layout(step, replica)
    model, layout = replica.model, replica.layout
    full_read = False
    if isinstance(weights, Refresh):
        refresh = weights
        state, full_read = sync_replica(replica, refresh)
        forget = getattr(refresh.full, "forget", None)
        if alone and replica.refresh_state is None and forget is not None:
            before: np.ndarray | list[np.ndarray] = layout.buffer_bytes(state)
            del state
            forget()
        else:
            before = state
    else:
        layout.load_state(model, weights)
        before = weights
    set_training_modes(model, replica.train_modes)     # as the user left each module
    model.zero_grad(set_to_none=True)
    mean = replica.reduction == "mean"
    loss_sum, normaliser_sum = 0.0, 0.0
    rng = (transform_generator(step.seed, step.iteration, partition)
           if replica.train_transform is not None else None)
    for chunk in _chunks(indices, step.micro_batch_size):
        loss, multiplier, normaliser = chunk_loss(replica, shard, chunk, step.precision,
                                                  partition, rng)
        if replica.sample_weights or replica.normalised:
            normaliser_sum += normaliser
            if loss is None:            # no target of this chunk counts
                continue
            # the loss sum over the batch size (float16 range); the driver multiplies back
            weight = multiplier
            factor = multiplier / step.batch_size * step.loss_scale
        else:
            weight = len(chunk) / step.batch_size if mean else 1.0
            factor = weight * step.loss_scale               # the scale is 1 or a power of 2
        (loss * factor).backward()
        loss_sum += float(loss.detach()) * weight
    # alone: the gradients themselves, not a copy (a sub-replica's are summed into the first)
    vector, present = layout.gradients(model, release=True, segmented=alone)
    rows = layout.table_rows(model) if layout.tables else {}
    return (vector, present, loss_sum, normaliser_sum, layout.changed_buffers(model, before),
            rows, full_read)


def compute_metric_sums(shard: Shard | None, replica: Replica, weights: np.ndarray,
                        metrics: Sequence[ValidationMetric], batch_size: int,
                        precision: str = "32", partition: int | None = None
                        ) -> tuple[list[np.ndarray] | None, int]:
    """Metric sums over all of a partition's validation samples (None if its shard is gone);
    ``partition`` names it in an error."""
    if shard is None:
        return None, 0
    model = replica.model
    if replica.refresh_state is not None:     # its model no longer holds the refreshed weights
        replica.refresh_state.model_synced = False
    replica.layout.load_state(model, weights)
    model.eval()
    sums: list[np.ndarray] = [np.zeros(0)] * len(metrics)
    needs_output = not all(uses_step_loss(m, replica.criterion, replica.training_step)
                           for m in metrics)
    with torch.no_grad():
        for lo in range(0, shard.count, batch_size):
            idx = np.arange(lo, min(lo + batch_size, shard.count))
            features, labels = shard.take(idx)
            if replica.sample_weights:      # validation metrics are unweighted
                features = features[:-1]
            inputs, target = _to_tensors(features, labels, replica.layout.param_dtype,
                                         replica.device, replica)
            origin = IdOrigin(argument_names(features, replica.input_names, replica.collate),
                              partition, idx, "validation")
            output = None
            if needs_output:
                with autocast(precision, replica.device), checked_ids(model, inputs, origin):
                    output = (replica.validation_step(model, inputs, target)
                              if replica.validation_step is not None else model(*inputs))
            for m, metric in enumerate(metrics):
                if uses_step_loss(metric, replica.criterion, replica.training_step):
                    with autocast(precision, replica.device), \
                            checked_ids(model, inputs, origin):   # the step's own model calls
                        part = step_loss_sums(replica.training_step, model, inputs, target)
                else:
                    part = metric.partial(output, target, replica.criterion)
                sums[m] = part if sums[m].size == 0 else sums[m] + part
    return sums, shard.count
