"""A local round in a task: H inner steps of one partition's own optimizer on its share of H
global batches, then its weighted delta (executor side; also called in process).

The definition (docs/guide/local-rounds.md; design notes section 8): at the start of a round
every partition's worker holds the global weights ``w_r``. For each iteration ``t`` of the
round, worker ``i`` takes exactly the samples synchronous SGD's plan gives partition ``i`` at
``t`` (:class:`sparkdl.data.batch_plan.BatchPlan`) and makes one step of its own copy of the
user's optimizer on the mean loss of those samples (clipping on its own gradient; a
per-iteration scheduler stepped after every iteration, a per-epoch one after the iteration
that closes an epoch, on its own copy). A worker whose share of an iteration is empty makes no
step there (its scheduler still steps). At the round's end it returns, through the AllReduce,
``(n_i / n) * (w_r - w_i)`` (``n_i``: the samples it took in the round, ``n``: all
partitions'), its changed buffers (averaged by the same weights on the driver), and only
scalars in its report: its optimizer's and scheduler's state stay where it ran, beside its
shard (:mod:`sparkdl.executor.round_states`), for the partition's next round.

A round's task is a pure function of the round's global weights, its partition's inner state
at the round's start and its shard: a retried task, a task on another executor and a resumed
driver compute the same bits.

:class:`RoundTask` is the job's function (the AllReduce's ``task(partition, summary)``); its
``step`` has the per-partition sample counts a pass's task asks for.

Example::

    vector, report = RoundTask(data_key, spec, bundle_bc, start_bc).compute(p, shard)
"""

from __future__ import annotations

import math
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..data.batch_plan import task_seed, transform_generator
from ..errors import SparkdlError, permanent_report
from ..transport.pieced_broadcast import FileValue
from .devices import task_device
from .executor_identity import executor_location
from .hop_task import HopBundle, optimizer_step, step_task_scheduler
from .live_runs import LiveRuns, evict_finished
from .process_memory import current_rss_bytes
from .replicas import _REPLICAS, Replica, set_training_modes
from .round_states import DurableStates, StateDir, load_state, save_state
from .shard_store import Shard, open_shard
from .step import TaskReport, seed_task, set_task_threads
from .tasks import task_attempt
from .worker_cache import WorkerCache, freeze_imports_once

__all__ = ["RoundSpec", "RoundReport", "RoundReplay", "RoundTask", "train_round",
           "weighted_delta"]


@dataclass(frozen=True)
class RoundSpec:
    """One round's instructions to every task (small; in the job's closure).

    ``iterations``, ``epochs`` and ``epoch_ends``: the round's global iterations (0-based),
    the epoch of each and whether it closes its epoch; ``starts`` and ``shares``: per
    iteration (rows) and partition (columns), where the partition's share starts in its epoch
    order and its size (the sync plan's); ``counts``: each partition's samples in the round."""

    seed: int
    shuffle: bool
    iterations: tuple[int, ...]
    epochs: tuple[int, ...]
    epoch_ends: tuple[bool, ...]
    starts: np.ndarray
    shares: np.ndarray
    counts: np.ndarray
    micro_batch_size: int | None = None
    precision: str = "32"
    device: str = "auto"
    scheduler: str = ""              # "iteration", "epoch" (stepped here) or "" (none here)
    scheduler_metric: bool = False   # the per-iteration scheduler's step takes the batch loss
    closure: bool = False            # the optimizer's step takes a closure (LBFGS)
    sub_replicas: int = 1            # what a pass's task reads of a step (always one here)
    fit_key: str = ""                # names the fit's states beside the shards
    round_index: int = 0             # the fit's rounds before this one
    initial: bool = False            # the first round: every partition starts from the bundle's
    durable: str = ""                # where the first round's starting states and every
    every: int = 0                   # ``every``-th round's states after it are copied ("": none)
    stateless: tuple[int, ...] = ()  # partitions without samples in the fit: no state kept
    lrs: tuple[float, ...] | None = None   # the learning rates a driver-side scheduler set

    @property
    def next_iteration(self) -> int:
        """The first iteration of the partition's next round (where its state is kept)."""
        return self.iterations[-1] + 1

    @property
    def total(self) -> int:
        """All partitions' samples in the round."""
        return int(self.counts.sum())


@dataclass
class RoundReport(TaskReport):
    """A round task's report: a :class:`~sparkdl.executor.step.TaskReport` (``count``: its
    samples in the round) with each iteration's loss sum and rows, its optimizer steps, what
    was not finite, and whether its inner state at the round's start was not found where it
    ran (``missing_state``: the driver has it rebuilt, :class:`RoundReplay`)."""

    loss_sums: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)     # the first group's, at each iteration
    steps: int = 0
    steps_s: float = 0.0      # the seconds of its inner steps (compute_s less its round's
    # fixed cost: unpickling the model and its state, the delta, the state pickled back)
    cpu_s: float = 0.0        # its thread's CPU seconds over compute_s (less than compute_s:
    # it waited for a core, the JVM's or another task's)
    nonfinite: str | None = None
    missing_state: bool = False


@dataclass(frozen=True)
class RoundReplay:
    """How a task rebuilds a partition's state that is not where it runs: from the durable
    copy at ``iteration`` (``from_bundle``: the bundle's own state, the first round's), the
    fit's ``rounds`` since, each its spec and its global start weights."""

    iteration: int
    from_bundle: bool
    rounds: Sequence[tuple[RoundSpec, np.ndarray]]


def weighted_delta(model: torch.nn.Module, layout: Any, start: np.ndarray, weight: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``weight * (w_start - w)`` of every trainable parameter as the layout's gradient vector,
    and which parameters are present (all; ``start``: the round's state vector). A dense
    parameter on the CPU in the vector's dtype is written straight into its range (one pass,
    no tensor of its own: at hundreds of millions of values the copies were most of a round's
    fixed cost); any other goes through its ``.grad`` as before: dense, or for a table built
    with ``sparse=True`` a sparse tensor of the changed rows, as the layout's gradient and rows
    readers take them. The same float operations either way (a float32 subtraction, then a
    multiplication by ``weight`` rounded to the dtype), so the same bits."""
    tensors = dict(model.named_parameters())
    direct = [not slot.rows and slot.dtype == layout.torch_dtype and
              tensors[slot.name].device.type == "cpu" for slot in layout.params]
    with torch.no_grad():
        for k, slot in enumerate(layout.params):
            p = tensors[slot.name]
            if direct[k]:
                p.grad = None
                continue
            before = layout.param_value(start, k).to(p.device)
            delta = (before - p.detach()).mul_(weight)
            if slot.sparse:
                delta = delta.to_sparse(sparse_dim=1).coalesce()
            p.grad = delta
    out, present = layout.gradients(model)       # the others' ranges (zeros where direct)
    scale = np.asarray(weight, dtype=layout.numpy_dtype)
    with torch.no_grad():
        for k, slot in enumerate(layout.params):
            if not direct[k]:
                continue
            present[k] = 1
            target = out[slot.start:slot.stop]
            before = start[slot.byte_start:slot.byte_stop].view(layout.numpy_dtype)
            np.subtract(before, tensors[slot.name].detach().reshape(-1).numpy(), out=target)
            np.multiply(target, scale, out=target)
    return out, present


def restores_fully(bundle: HopBundle) -> bool:
    """Whether loading a round's inner state puts ``bundle``'s optimizer and scheduler exactly
    where a fresh unpickled copy loading it would be: torch's own classes, whose state dicts
    hold everything they keep (a user's class may keep more, outside its state dict)."""
    return all(obj is None or type(obj).__module__.startswith("torch.optim.")
               for obj in (bundle.optimizer, bundle.lr_scheduler))


def round_model(bundle_bytes: bytes | Callable[[], bytes], device: str, run_key: str | None,
                resumes: bool, kept: WorkerCache | None = None) -> tuple[HopBundle, Replica]:
    """The fit's bundle (unpickled) and its replica on ``device``. With a ``run_key`` and a
    round that loads an inner state (``resumes``) into an optimizer and scheduler that
    :func:`restores_fully`, they are kept in this worker for the run's next rounds (with the
    sync replicas, evicted when the run ends): each round loads every parameter and buffer
    from its start vector and the whole optimizer and scheduler state, so a kept copy computes
    the bits a fresh one does, without reading and unpickling the model again (at hundreds of
    millions of parameters most of a round's fixed cost). ``bundle_bytes``: the pickled
    :class:`~sparkdl.executor.hop_task.HopBundle`, or a function that reads it; ``kept``: the
    cache (default: this worker's replicas')."""
    cache = _REPLICAS if kept is None else kept
    key = (run_key, device, "round")    # a first round (no state to load) unpickles afresh
    if run_key is not None and resumes:
        found = cache.get(key)
        if found is not None:
            return found
    raw = bundle_bytes() if callable(bundle_bytes) else bundle_bytes
    bundle: HopBundle = pickle.loads(raw)
    made = (bundle, Replica(bundle.spec, device))
    if run_key is not None and restores_fully(bundle):
        cache.put(key, made)        # a first round's too: the next rounds load their state
    return made


def train_round(spec: RoundSpec, partition: int, shard: Shard | None,
                bundle_bytes: bytes | Callable[[], bytes], start: np.ndarray | bytes,
                inner_state: dict[str, Any] | None, device: str = "cpu",
                run_key: str | None = None, kept: WorkerCache | None = None,
                started: Callable[[dict[str, Any]], None] | None = None
                ) -> tuple[np.ndarray | None, RoundReport, dict[str, Any] | None]:
    """Partition ``partition``'s round (see the module docstring): the weighted delta vector
    (None when the partition took no sample), its report and its inner state after the round
    (None after a non-finite loss). ``bundle_bytes``: the fit's pickled
    :class:`~sparkdl.executor.hop_task.HopBundle`; ``start``: the round's state vector;
    ``inner_state``: ``{"optimizer": ..., "scheduler": ...}`` state dicts at the round's start
    (None: the bundle's own); ``run_key``: the run's, to keep the model in this worker between
    rounds (:func:`round_model`, in ``kept``); ``started``: called with the state the round
    starts from (its durable copy)."""
    report = RoundReport(partition=partition, attempt=task_attempt(), started_at=time.time())
    count = int(spec.counts[partition])
    report.count = count
    if count and shard is None:
        report.missing_shard = True
        return None, report, None
    t0, c0 = time.perf_counter(), time.thread_time()
    if isinstance(start, (bytes, bytearray)):       # as a broadcast carries it
        start = np.frombuffer(start, dtype=np.uint8)
    bundle, replica = round_model(bundle_bytes, device, run_key, inner_state is not None, kept)
    model, optimizer, scheduler = replica.model, bundle.optimizer, bundle.lr_scheduler
    layout = replica.layout
    layout.load_state(model, start)
    if inner_state is not None:
        optimizer.load_state_dict(inner_state["optimizer"])
        if scheduler is not None and inner_state.get("scheduler") is not None:
            scheduler.load_state_dict(inner_state["scheduler"])
    if spec.lrs is not None:
        for group, lr in zip(optimizer.param_groups, spec.lrs):
            group["lr"] = lr
    if started is not None:
        started(inner_state if inner_state is not None and spec.lrs is None
                else _inner_state(optimizer, scheduler))
    set_training_modes(model, replica.train_modes)
    for j, iteration in enumerate(spec.iterations):
        rows = int(spec.shares[j, partition])
        report.lrs.append(float(optimizer.param_groups[0]["lr"]))
        loss: float | None = None
        if rows:
            assert shard is not None
            t_step = time.perf_counter()
            loss = _inner_step(spec, j, partition, shard, replica, model, optimizer,
                               bundle.clipping, device)
            report.steps_s += time.perf_counter() - t_step
            if loss is not None and not math.isfinite(loss):
                report.nonfinite = (f"the loss is {loss} at iteration {iteration + 1} on "
                                    f"partition {partition} (an inner step of the round)")
                break
        report.loss_sums.append(0.0 if loss is None else loss * rows)
        report.rows.append(0 if loss is None else rows)
        report.steps += int(loss is not None)
        if scheduler is not None and spec.scheduler == "iteration":
            step_task_scheduler(scheduler, *((loss if loss is not None else math.nan,)
                                             if spec.scheduler_metric else ()))
        if scheduler is not None and spec.scheduler == "epoch" and spec.epoch_ends[j]:
            step_task_scheduler(scheduler)
    optimizer.zero_grad(set_to_none=True)
    if report.nonfinite is None:
        for name, value in model.state_dict().items():
            if value.is_floating_point() and not all_finite(value):
                report.nonfinite = (f"the weights {name} have non-finite values after the "
                                    f"round's inner steps on partition {partition}")
                break
    report.rss_bytes = current_rss_bytes()
    if report.nonfinite is not None:
        report.compute_s, report.cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        report.finished_at = time.time()
        return None, report, None
    after = _inner_state(optimizer, scheduler)
    vector: np.ndarray | None = None
    if count:
        vector, report.grad_present = weighted_delta(model, layout, start, count / spec.total)
        report.table_rows = layout.table_rows(model) or None
        report.buffers = layout.changed_buffers(model, start)
        for p in model.parameters():       # a kept model starts its next round without them
            p.grad = None
    report.compute_s, report.cpu_s = time.perf_counter() - t0, time.thread_time() - c0
    report.finished_at = time.time()
    return vector, report, after


def _inner_state(optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """The optimizer's and scheduler's state dicts as a state file holds them."""
    return {"optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None}


def all_finite(value: torch.Tensor) -> bool:
    """Whether every value of a floating-point tensor is finite: its sum in float64 is finite
    exactly when they are (no sum of float32 or narrower values reaches float64's range; one
    that does is looked at value by value), one pass without a tensor of flags."""
    return (bool(torch.isfinite(value.sum(dtype=torch.float64))) or
            bool(torch.isfinite(value).all()))


def _inner_step(spec: RoundSpec, j: int, partition: int, shard: Shard, replica: Replica,
                model: torch.nn.Module, optimizer: Any, clipping: Any, device: str
                ) -> float | None:
    """One inner step on the partition's share of the round's ``j``-th iteration; its loss
    (None when no term of the share counts: no step)."""
    iteration, epoch = spec.iterations[j], spec.epochs[j]
    seed_task(task_seed(spec.seed, iteration, partition), device)
    rng = (transform_generator(spec.seed, iteration, partition)
           if replica.train_transform is not None else None)
    begin = int(spec.starts[j, partition])
    indices = shard.permutation(spec.seed, epoch, partition, spec.shuffle)[
        begin:begin + int(spec.shares[j, partition])]
    return optimizer_step(replica, model, optimizer, clipping, shard, indices, spec, partition,
                          rng)


@dataclass
class RoundTask:
    """A round's map side for the AllReduce: ``(partition, summary) -> (vector or None,
    RoundReport)``. ``bundle``: a broadcast of the fit's pickled HopBundle (shipped once per
    fit); ``start``: a broadcast of the round's state vector; ``replay``: a broadcast of a
    :class:`RoundReplay` when a partition's state has to be rebuilt (None: every task reads
    its own beside its shard, :mod:`sparkdl.executor.round_states`)."""

    data_key: str
    step: RoundSpec
    bundle: Any
    start: Any
    replay: Any = None
    live: LiveRuns | None = None
    run_key: str | None = None      # the run's: its model kept in the worker between rounds
    kept: Any = None                # where (None: the worker's replicas; in process: the fit's)
    state_root: str | None = None   # where states are kept (None: beside this executor's shards)

    def __call__(self, partition: int, summary: Any) -> tuple[np.ndarray | None, RoundReport]:
        evict_finished(self.live)
        freeze_imports_once()
        return self.compute(partition, open_shard(self.data_key, partition)
                            if partition not in self.step.stateless else None)

    def compute(self, partition: int, shard: Any) -> tuple[np.ndarray | None, RoundReport]:
        """The round on ``shard`` (None: not here, a missing shard when it has samples). A
        permanent sparkdl error is reported, not raised (as a gradient task's)."""
        spec = self.step
        try:
            set_task_threads()
            choice = task_device(spec.device)
            bundle = lambda: _value(self.bundle)    # noqa: E731
            keeps = partition not in spec.stateless
            here = StateDir(self.data_key, spec.fit_key, partition, self.state_root)
            state: dict[str, Any] | None = None
            if keeps and not spec.initial:
                state = load_state(here.path(spec.iterations[0]))
                if state is None and spec.durable:     # copied where checkpoints go
                    state = DurableStates(spec.durable).load(spec.iterations[0], partition)
                if state is None:
                    if self.replay is None:
                        return None, RoundReport(partition=partition, attempt=task_attempt(),
                                                 missing_state=True)
                    state, missing = self._replayed(partition, shard, bundle, choice.device)
                    if missing is not None:
                        return None, missing
            copy = DurableStates(spec.durable) if keeps and spec.durable else None
            started = None if copy is None or not spec.initial else (   # the replays' start
                lambda s: None if copy.has(spec.iterations[0], partition)
                else copy.save(spec.iterations[0], partition, s))
            vector, report, after = train_round(
                spec, partition, shard, bundle, _start(self.start), state, choice.device,
                self.run_key, self.kept, started)
            if keeps and after is not None:
                save_state(here.path(spec.next_iteration), after)
                here.drop_before(spec.iterations[0])   # the rounds before this one committed
                if copy is not None and spec.every and (spec.round_index + 1) % spec.every == 0:
                    copy.save(spec.next_iteration, partition, after)
        except SparkdlError as exc:
            fatal = permanent_report(exc)
            if fatal is None:
                raise
            return None, RoundReport(partition=partition, attempt=task_attempt(), fatal=fatal)
        report.device = f"{choice.device} ({choice.reason})"
        report.executor = executor_location()
        return vector, report

    def _replayed(self, partition: int, shard: Any, bundle: Callable[[], bytes], device: str
                  ) -> tuple[dict[str, Any] | None, RoundReport | None]:
        """The partition's state at this round's start rebuilt: its durable copy, then the
        rounds since replayed with their global weights (each a pure function of them, the
        state and the shard: the same bits). A missing shard is reported."""
        plan: RoundReplay = _value(self.replay)
        state: dict[str, Any] | None = None
        if not plan.from_bundle:
            state = DurableStates(self.step.durable).load(plan.iteration, partition)
            if state is None:
                raise SparkdlError(
                    f"partition {partition}'s durable round state at iteration "
                    f"{plan.iteration + 1} is missing under {self.step.durable}: its rounds "
                    "cannot be replayed (was the directory cleaned during the fit?)")
        for past, weights in plan.rounds:
            _, report, state = train_round(past, partition, shard, bundle, weights, state,
                                           device)
            if report.missing_shard:
                return None, report
            if state is None:
                raise SparkdlError(f"partition {partition}: replaying the round starting at "
                                   f"iteration {past.iterations[0] + 1} did not end finite")
        return state, None


def _start(held: Any) -> Any:
    """The round's state vector: mapped from its file on a local master (no copy of the
    weights in the worker: the page cache's pages, shared by the tasks), else the value."""
    if isinstance(held, FileValue) and held.raw:
        return held.mapped()
    return _value(held)


def _value(held: Any) -> Any:
    """A broadcast's value, or the value itself (in process)."""
    return held.value if hasattr(held, "value") else held
