"""A model hopping job in a task: whole models trained with sequential SGD on the cached shards
where the task runs (executor side; also called in process).

The driver ships each model as a :class:`HopBundle` (its
:class:`~sparkdl.executor.replicas.ReplicaSpec`, optimizer, scheduler when the task steps it,
and clipping, cloudpickled together so the optimizer keeps referring to the model's
parameters) with its :class:`HopSpec`: the sub-epochs (:class:`Visit`) to run, the first on the
task's own partition, the next ones as long as their shards are on this executor.
:func:`train_on_shard` unpickles a fresh copy (a retried task starts from the same bytes, so it
computes the same bits) and for each visit walks the shard in the model's own epoch order
(:func:`sparkdl.data.batch_plan.local_permutation`) in batches of its own size (the last one
smaller), doing for each batch what single-process PyTorch does: zero the gradients, forward,
backward of the batch's mean loss (its sum for ``reduction='sum'``; the weighted mean with
sample weights; a training step's loss), clipping, ``optimizer.step()`` and, when the
scheduler steps per iteration, ``scheduler.step()`` (per epoch: after the visit that closes the
epoch). It returns the model's, optimizer's and scheduler's state dicts, pickled, and each
visit's figures.

Randomness: before a model trains on partition ``p`` in epoch ``e`` the task's torch generator
is seeded with ``task_seed(seed, e, p)`` and a ``train_transform`` draws from
``transform_generator(seed, e, p)``; batches then draw in order.

:class:`HopTask` is the Spark function over the training data's index RDD: it trains the models
the driver assigned to its partition, one after another, in the assignment's order.

Example::

    report = train_on_shard(cloudpickle.dumps(bundle), lambda p: shards[p], spec)
"""

from __future__ import annotations

import math
import pickle
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..data.batch_plan import local_permutation, task_seed, transform_generator
from ..errors import SparkdlError, permanent_report
from .live_runs import LiveRuns, evict_finished
from .process_memory import current_rss_bytes
from .replicas import Replica, ReplicaSpec, non_persistent_buffers, set_training_modes
from .shard_store import Shard, open_shard
from .tasks import task_attempt
from .worker_cache import freeze_imports_once
from .step import _chunks, chunk_loss, seed_task, set_task_threads

__all__ = ["HopBundle", "Visit", "HopSpec", "VisitRecord", "HopReport", "HopPartitionResult",
           "batch_backward", "optimizer_step",
           "step_task_scheduler",
           "HopTask", "train_on_shard"]


@dataclass
class HopBundle:
    """One model as it hops: pickled together so that the optimizer (and scheduler) keep
    referring to the model's own parameters."""

    spec: ReplicaSpec
    optimizer: Any
    lr_scheduler: Any = None       # stepped in the task (not a metric scheduler per epoch)
    clipping: Any = None           # sparkdl.engine.fit.optim.clipping.GradientClipping, or None


@dataclass(frozen=True)
class Visit:
    """One sub-epoch of a model: ``partition`` (``count`` samples) in ``epoch``; ``epoch_end``:
    the visit closes the epoch (a per-epoch scheduler steps after it)."""

    epoch: int
    partition: int
    count: int
    epoch_end: bool = False


@dataclass(frozen=True)
class HopSpec:
    """How one model trains in one job (small; in the job's closure): its ``visits`` in order,
    the first on the task's own partition, the others run on in the same task while their
    shards are on this executor (consecutive sub-epochs fused: no state travels between
    them)."""

    seed: int
    visits: tuple[Visit, ...]
    shuffle: bool
    batch_size: int
    micro_batch_size: int | None = None
    precision: str = "32"
    scheduler: str = ""              # "iteration", "epoch" (stepped here) or "" (none here)
    scheduler_metric: bool = False   # the per-iteration scheduler's step takes the batch loss
    closure: bool = False            # the optimizer's step takes a closure (LBFGS)


@dataclass
class VisitRecord:
    """One visit's figures: its samples and optimizer steps, the sum over its batches of the
    batch's loss times its rows, its seconds."""

    partition: int
    samples: int = 0
    steps: int = 0
    loss_sum: float = 0.0
    compute_s: float = 0.0


@dataclass
class HopReport:
    """What a task tells the driver about one model: the visits it made (a prefix of its
    spec's: it stops at a shard that is not on this executor) and the states after them."""

    model: int
    partition: int
    visits: list[VisitRecord] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0
    attempt: int = 0
    rss_bytes: int = 0
    nonfinite: str | None = None    # what was not finite, and where (then no state)
    fatal: tuple[str, str] | None = None   # a permanent error (class name, message)
    state: bytes | None = None      # pickled (model state, optimizer state, scheduler state)

    @property
    def compute_s(self) -> float:
        return sum(v.compute_s for v in self.visits)


@dataclass
class HopPartitionResult:
    """A hop task's result: its partition's models' reports, in the assignment's order."""

    partition: int
    reports: list[HopReport] = field(default_factory=list)
    missing_shard: bool = False


def batch_backward(replica: Replica, model: torch.nn.Module, shard: Shard,
                    indices: np.ndarray, spec: HopSpec, partition: int,
                    rng: np.random.Generator | None) -> float | None:
    """Gradients of the batch's loss (in micro-batches when asked) in ``p.grad``; returns the
    loss, or None when no term of the batch counts (every target ignored)."""
    rows = len(indices)
    chunks = _chunks(indices, spec.micro_batch_size)
    divided = replica.normalised or replica.sample_weights
    total_loss, total_normaliser = 0.0, 0.0
    for chunk in chunks:
        loss, multiplier, normaliser = chunk_loss(replica, shard, chunk, spec.precision,
                                                  partition, rng)
        if divided:
            total_normaliser += normaliser
            if loss is None:
                continue
            if len(chunks) == 1:        # the batch's own mean: single-process arithmetic
                if not normaliser > 0:
                    return None
                mean = loss * (multiplier / normaliser)
                mean.backward()
                return float(mean.detach())
            (loss * multiplier).backward()
            total_loss += float(loss.detach()) * multiplier
        else:
            weight = len(chunk) / rows if replica.reduction == "mean" else 1.0
            (loss * weight if len(chunks) > 1 else loss).backward()
            total_loss += float(loss.detach()) * weight
    if divided:
        if not total_normaliser > 0:
            return None
        with torch.no_grad():           # the sum's gradient over the union's normaliser
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(total_normaliser)
        return total_loss / total_normaliser
    return total_loss


def optimizer_step(replica: Replica, model: torch.nn.Module, optimizer: Any, clipping: Any,
                   shard: Shard, indices: np.ndarray, spec: Any, partition: int,
                   rng: np.random.Generator | None) -> float | None:
    """One step of ``optimizer`` on the batch ``indices`` of the shard, as single-process
    PyTorch makes it: zero the gradients, the batch's loss backward (:func:`batch_backward`),
    clipping, ``optimizer.step()`` (with a closure that evaluates the batch when ``spec.closure``:
    LBFGS). Returns the batch's loss; no step when it is None (no term counts) or not finite."""
    if spec.closure:                    # the optimizer evaluates the batch itself (LBFGS)
        evaluated: list[float | None] = []

        def closure() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            value = batch_backward(replica, model, shard, indices, spec, partition, rng)
            if value is not None and clipping is not None:
                clipping.apply(model)
            evaluated.append(value)
            return torch.tensor(math.nan if value is None else value, dtype=torch.float64)

        optimizer.step(closure)
        return evaluated[0]
    optimizer.zero_grad(set_to_none=True)
    loss = batch_backward(replica, model, shard, indices, spec, partition, rng)
    if loss is not None and math.isfinite(loss):
        if clipping is not None:
            clipping.apply(model)
        optimizer.step()
    return loss


def _not_finite_weights(model: torch.nn.Module, partition: int) -> str | None:
    """What is not finite in the model's weights after a visit (a gradient with inf or NaN
    values that the batch's loss did not show), or None."""
    for name, value in model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return (f"the weights {name} have non-finite values after the visit to partition "
                    f"{partition} (a non-finite gradient)")
    return None


def train_on_shard(bundle_bytes: bytes, shard_of: Callable[[int], Shard | None],
                   spec: HopSpec, model_index: int = 0) -> HopReport:
    """Train the pickled model of ``bundle_bytes`` over its visits, batch by batch (see the
    module docstring); ``shard_of(partition)``: the shard where this task runs, or None (the
    visits stop there: the driver runs the rest elsewhere). The report carries the new states
    (``state``), or what was not finite (``nonfinite``: then no state)."""
    first = spec.visits[0].partition
    report = HopReport(model_index, first, attempt=task_attempt(), started_at=time.time())
    bundle: HopBundle = pickle.loads(bundle_bytes)
    replica = Replica(bundle.spec, "cpu")
    model, optimizer, scheduler = replica.model, bundle.optimizer, bundle.lr_scheduler
    set_training_modes(model, replica.train_modes)
    for visit in spec.visits:
        shard = shard_of(visit.partition) if visit.count else None
        if visit.count and shard is None:
            break                       # not on this executor: the driver goes on elsewhere
        t0 = time.perf_counter()
        record = VisitRecord(visit.partition)
        if visit.count:
            assert shard is not None
            report.nonfinite = _visit(replica, model, optimizer, scheduler, bundle.clipping,
                                      shard, visit, spec, record)
            if report.nonfinite is None:    # a non-finite gradient shows in the weights
                report.nonfinite = _not_finite_weights(model, visit.partition)
            if report.nonfinite is not None:
                break
        if scheduler is not None and visit.epoch_end and spec.scheduler == "epoch":
            step_task_scheduler(scheduler)
        record.compute_s = time.perf_counter() - t0
        report.visits.append(record)
    optimizer.zero_grad(set_to_none=True)
    if report.nonfinite is None:
        report.state = pickle.dumps(
            (model.state_dict(), non_persistent_buffers(model), optimizer.state_dict(),
             scheduler.state_dict() if scheduler is not None else None),
            protocol=pickle.HIGHEST_PROTOCOL)
    report.rss_bytes = current_rss_bytes()
    report.finished_at = time.time()
    return report


def step_task_scheduler(scheduler: Any, *args: Any) -> None:
    """Step a scheduler the way a task steps it (``args``: a metric scheduler's value): per
    iteration, or per epoch after the visit or iteration that closes the epoch (hop: also on
    the driver when that visit's partition is empty and no task ran)."""
    # an unpickled optimizer's step is not wrapped, and its steps ran in tasks: torch's two
    # warnings about the order of the steps do not apply
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Seems like `optimizer.step", UserWarning)
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step()`", UserWarning)
        scheduler.step(*args)


def _visit(replica: Replica, model: torch.nn.Module, optimizer: Any, scheduler: Any,
           clipping: Any, shard: Shard, visit: Visit, spec: HopSpec,
           record: VisitRecord) -> str | None:
    """One sub-epoch: the shard in its epoch order, one optimizer step per batch; what was not
    finite, or None."""
    partition = visit.partition
    seed_task(task_seed(spec.seed, visit.epoch, partition), "cpu")
    rng = (transform_generator(spec.seed, visit.epoch, partition)
           if replica.train_transform is not None else None)
    order = local_permutation(shard.count, spec.seed, visit.epoch, partition, spec.shuffle)
    for start in range(0, shard.count, spec.batch_size):
        indices = order[start:start + spec.batch_size]
        loss = optimizer_step(replica, model, optimizer, clipping, shard, indices, spec,
                              partition, rng)
        if loss is None:                # no term of the batch counts: no step
            continue
        if not math.isfinite(loss):
            return (f"the loss is {loss} at batch {start // spec.batch_size + 1} of partition "
                    f"{partition} (epoch {visit.epoch + 1})")
        if scheduler is not None and spec.scheduler == "iteration":
            step_task_scheduler(scheduler, *((loss,) if spec.scheduler_metric else ()))
        record.steps += 1
        record.samples += len(indices)
        record.loss_sum += loss * len(indices)
    return None


@dataclass
class HopTask:
    """A sub-epoch's function for ``mapPartitionsWithIndex`` over the training data's index RDD:
    yields the partition's :class:`HopPartitionResult`. ``bundles``: a broadcast of
    ``{model: pickled HopBundle}``; ``assignments``: ``{partition: [(model, HopSpec)]}``."""

    data_key: str
    bundles: Any
    assignments: dict[int, list[tuple[int, HopSpec]]]
    live: LiveRuns | None = None
    shards: Sequence[Shard | None] | None = None    # in process: every partition's shard

    def __call__(self, partition: int, records: Iterator[Any]) -> Iterator[HopPartitionResult]:
        evict_finished(self.live)
        freeze_imports_once()
        for _ in records:
            pass
        wanted = bool(self.assignments.get(partition))
        yield self.compute(partition, open_shard(self.data_key, partition) if wanted else None)

    def compute(self, partition: int, shard: Shard | None) -> HopPartitionResult:
        """Train the partition's models on ``shard`` (None: not here, a missing shard). A
        permanent sparkdl error is reported in the model's report, not raised."""
        wanted = self.assignments.get(partition, [])
        if not wanted:
            return HopPartitionResult(partition)
        if shard is None:
            return HopPartitionResult(partition, missing_shard=True)
        set_task_threads()
        bundles = self.bundles if isinstance(self.bundles, dict) else self.bundles.value
        result = HopPartitionResult(partition)

        def shard_of(p: int) -> Shard | None:
            if p == partition:
                return shard
            return self.shards[p] if self.shards is not None else open_shard(self.data_key, p)

        for model, spec in wanted:
            try:
                report = train_on_shard(bundles[model], shard_of, spec, model)
            except SparkdlError as exc:
                fatal = permanent_report(exc)
                if fatal is None:
                    raise
                report = HopReport(model, partition, attempt=task_attempt(), fatal=fatal)
            result.reports.append(report)
        return result
