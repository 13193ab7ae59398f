"""Model hopping: several fits trained where the data sits, at most one Spark job per sub-epoch
for all of them (driver side; Cerebro's model hopper parallelism).

An epoch is ``P`` sub-epochs over the ``P`` cached training partitions. In each sub-epoch every
active fit's model is on one partition (:mod:`sparkdl.engine.strategies.hop.order`); the task of
partition ``i`` trains the models on ``i``, one after another, with plain sequential SGD over its
shard (:func:`sparkdl.executor.hop_task.train_on_shard`): each model's own batch size, optimizer,
per-iteration scheduler, clipping and seed. Only weights and optimizer states travel, at most once
per sub-epoch: the driver ships each model with its optimizer (a broadcast for the job) and takes
their new states back into the fit's own objects. So each model equals single-process PyTorch
trained on the same shards in its visiting order, partition by partition, batch by batch, and
the run is bitwise repeatable: a retried task, a lost executor (the sub-epoch re-runs from the
states the driver kept) and a resumed checkpoint (taken at sub-epoch ends) give the same bits.

Fusing: a job is the unit the driver needs, not the sub-epoch. When the next sub-epochs of a
model visit partitions whose shards are on the same executor, its task runs on through them
(no state travels between them), up to the first sub-epoch after which the driver must act: a
trigger that may fire, a validation, a checkpoint, a metric scheduler's step (:func:`horizon`).
A shard that is not there ends the task's run; the driver goes on from there in the next job.
So one executor holding every shard (``local[N]``) trains a search without validation in one
job, and with validation at epoch ends in one job per epoch; on a cluster a model's state
travels when its next partition is on another executor. Fused or not, the same bits.

For the fits, an iteration is one sub-epoch: ``MaxEpoch(n)`` ends after ``n * P`` of them,
``MaxIteration(n)`` after ``n``; the summary has one record per sub-epoch (the samples, the mean
loss over its batches); the end, validation and checkpoint triggers are asked after every
sub-epoch (``EveryEpoch`` validation: at epoch ends); an ``"epoch"`` scheduler steps
at epoch ends on the driver when it takes a metric (``ReduceLROnPlateau``: the validation loss,
else the epoch's mean training loss), else in the task after the sub-epoch that closes the epoch;
an ``"iteration"`` one in the task after every optimizer step.

Example::

    fits = [DistriOptimizer(make_net(), rdd, loss, make_opt(lr), batch_size=b, seed=0,
                            end_trigger=MaxEpoch(3)) for lr, b in grid]
    FitSet(fits, strategy="hop").run()
"""

from __future__ import annotations

import logging
import math
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ....errors import InvalidArgumentError, SparkdlError, raise_reported
from ....executor.hop_task import (HopBundle, HopReport, HopSpec, Visit, VisitRecord,
                                 step_task_scheduler)
from ....executor.process_memory import current_rss_bytes
from ....executor.replicas import ReplicaSpec, load_non_persistent_buffers
from ....triggers import (EveryEpoch, MaxEpoch, MaxIteration, SeveralIteration, TrainingState,
                        Trigger, TriggerAnd, TriggerOr)
from ...fit.lifecycle import FitLifecycle, stop_not_finite
from ...fit.optim.optimizer_sequence import (needs_closure, scheduler_needs_metric,
                                              task_scheduler_step)
from ...fit.optim.update_threads import one_update_thread
from ...fit.recovery import run_with_recovery
from ...fit.reports.summary import IterationRecord
from ...fit.run_context import RunContext

__all__ = ["HopMember", "HopJobs", "horizon", "next_change", "check_hop_settings"]

log = logging.getLogger("sparkdl")


def check_hop_settings(owner: str, precision: str, device: str) -> None:
    """What model hopping cannot do yet, refused before any job."""
    if precision == "16-mixed":
        raise InvalidArgumentError(
            f"{owner}: model hopping trains each model with its own optimizer inside the task, "
            "where float16 training needs a loss scaler of its own: use precision='32' or "
            "'bf16-mixed' with the 'hop' strategy, or the 'together' strategy.")
    if device == "cuda":
        raise InvalidArgumentError(
            f"{owner}: model hopping trains on the executors' CPUs in this version; use "
            "device='auto' or 'cpu' with the 'hop' strategy, or the 'together' strategy for "
            "GPU executors.")


@dataclass
class HopMember:
    """One fit of a hop: its run context (whose ``plan`` is a
    :class:`sparkdl.engine.strategies.hop.order.HopPlan`), its lifecycle (progress, validation,
    best weights, checkpoints), and the spec its model ships with."""

    ctx: RunContext
    lifecycle: FitLifecycle
    spec: ReplicaSpec
    cap: int = 0
    """When > 0: the next job runs at most this many sub-epochs (those that trained well
    before a fused run met a non-finite value, run again to keep their weights)."""

    @property
    def task_scheduler(self) -> str:
        """When the tasks step the fit's scheduler: ``"iteration"``, ``"epoch"`` (after a
        visit that closes an epoch), or ``""`` (none, or a metric scheduler stepped per epoch
        by the driver after validation)."""
        return task_scheduler_step(self.ctx.lr_scheduler, self.ctx.settings.lr_scheduler_step)

    @property
    def driver_scheduler(self) -> bool:
        """A metric scheduler (``ReduceLROnPlateau``) stepped per epoch on the driver."""
        ctx = self.ctx
        return (ctx.lr_scheduler is not None and ctx.settings.lr_scheduler_step == "epoch"
                and scheduler_needs_metric(ctx.lr_scheduler))


def next_change(trigger: Trigger, iteration: int, per_epoch: int,
                validation: Trigger | None) -> float | None:
    """The first sub-epoch after ``iteration`` after which ``trigger`` may answer otherwise
    than now (``math.inf``: never), or None when sparkdl cannot tell: counts and epoch ends
    are known (MaxEpoch, MaxIteration, EveryEpoch, SeveralIteration, and their ``&``/``|``); a
    trigger that reads validation metrics changes only after a validation (``validation``: the
    fit's validation trigger, None without validation); any other may change anywhere."""
    epoch_end = (iteration // per_epoch + 1) * per_epoch
    if isinstance(trigger, (TriggerAnd, TriggerOr)):
        points = [next_change(c, iteration, per_epoch, validation) for c in trigger.children()]
        return None if any(p is None for p in points) else min(points)  # type: ignore[type-var]
    if isinstance(trigger, MaxEpoch):
        return max(trigger.limit * per_epoch, iteration + 1)
    if isinstance(trigger, MaxIteration):
        return max(trigger.limit, iteration + 1)
    if isinstance(trigger, EveryEpoch):
        return epoch_end
    if isinstance(trigger, SeveralIteration):
        return (iteration // trigger.interval + 1) * trigger.interval
    if trigger.metric_names() and not trigger.children():
        return (math.inf if validation is None else
                next_change(validation, iteration, per_epoch, None))
    return None


def horizon(member: HopMember) -> int:
    """How many sub-epochs fit ``member`` may run in one task from where it is: up to the
    first sub-epoch after which its end, validation or checkpoint trigger may fire
    (:func:`next_change`), and to its epoch's end when the driver acts there (validation,
    checkpoints, a metric scheduler); 1 when a trigger's timing is unknown."""
    ctx = member.ctx
    per_epoch = ctx.plan.iterations_per_epoch
    it = ctx.iteration
    validation = ctx.validation.trigger if ctx.validation is not None else None
    triggers = [ctx.end_trigger] + ([validation] if validation is not None else []) + (
        [ctx.checkpoints.setup.trigger] if ctx.checkpoints is not None else [])
    points = [next_change(t, it, per_epoch, validation) for t in triggers]
    if any(p is None for p in points):
        return 1
    if validation is not None or ctx.checkpoints is not None or member.driver_scheduler:
        points.append((it // per_epoch + 1) * per_epoch)
    stop = min(points)  # type: ignore[type-var]
    if stop == math.inf:                 # nothing ever ends it: an epoch at a time
        stop = (it // per_epoch + 1) * per_epoch
    return max(1, int(stop) - it)


class HopJobs:
    """The hop jobs of the fits of ``members`` (see the module docstring), run by a
    :class:`~sparkdl.engine.strategies.base.FitsDriver`: each round one job trains every
    active fit's model from its next sub-epoch on, and each fit completes its visits. The
    models travel through ``runner`` (a :class:`sparkdl.runners.interface.HopRunner`)."""

    def __init__(self, members: Sequence[HopMember], runner: Any) -> None:
        self.members = list(members)
        self.runner = runner
        self.jobs = 0

    def starting(self, active: list[int]) -> None:
        if active:
            partitions = self.members[active[0]].ctx.plan.num_partitions
            if len(active) < partitions:
                log.info("%d models hop over %d partitions: each job keeps at most %d of its "
                         "%d tasks busy (the 'together' strategy uses every task for every "
                         "model)", len(active), partitions, len(active), partitions)

    def iteration(self, active: list[int]) -> dict[int, Callable[[], bool]]:
        reports, job_s = self._hop_job(active)
        return {k: (lambda k=k: self._complete(k, reports.get(k), job_s)) for k in active}

    def _hop_job(self, active: list[int]) -> tuple[dict[int, HopReport], float]:
        """One job: every active fit's model trained from its next sub-epoch on, on that
        sub-epoch's partition, and on through the following sub-epochs of its horizon
        (:func:`horizon`) while their shards are on the same executor. A fit whose next
        partition is empty needs no task. Their reports by fit, and the job's time."""
        from pyspark import cloudpickle

        t0 = time.perf_counter()
        assignments: dict[int, list[tuple[int, HopSpec]]] = {}
        bundles: dict[int, bytes] = {}
        for k in active:
            member = self.members[k]
            ctx = member.ctx
            plan = ctx.plan
            counts = [s.count for s in ctx.train.summaries]
            if not counts[plan.partition_at(ctx.iteration)]:
                continue
            per_epoch = plan.iterations_per_epoch
            length = horizon(member)
            if member.cap:
                length, member.cap = min(length, member.cap), 0
            visits = tuple(Visit(t // per_epoch, plan.partition_at(t),
                                 counts[plan.partition_at(t)], (t + 1) % per_epoch == 0)
                           for t in range(ctx.iteration, ctx.iteration + length))
            settings = ctx.settings
            bundles[k] = cloudpickle.dumps(HopBundle(
                member.spec, ctx.optimizer,
                ctx.lr_scheduler if member.task_scheduler else None, ctx.clipping))
            assignments.setdefault(visits[0].partition, []).append((k, HopSpec(
                settings.seed, visits, settings.shuffle, settings.batch_size,
                settings.micro_batch_size, settings.runner_options.precision,
                member.task_scheduler,
                member.task_scheduler == "iteration" and scheduler_needs_metric(
                    ctx.lr_scheduler),
                needs_closure(ctx.optimizer))))
        if not bundles:
            return {}, time.perf_counter() - t0
        first = self.members[active[0]].ctx
        runner = self.runner
        self.jobs += 1
        what = f"hop job {self.jobs} ({len(bundles)} models)"
        results = run_with_recovery(
            first.runner, first.train, lambda: runner.hop(first.train, bundles, assignments),
            lambda rs: sorted(p for p, r in rs.items() if r.missing_shard), what)
        reports = {r.model: r for result in results.values() for r in result.reports}
        retried = sorted({r.partition for r in reports.values() if r.attempt > 0})
        if retried:
            log.warning("%s: tasks of partitions %s were retried by Spark; the result is "
                        "unchanged (each starts from the states the driver shipped)", what,
                        retried)
        log.debug("%s: partitions %s", what,
                  {p: [k for k, _ in entries] for p, entries in sorted(assignments.items())})
        return reports, time.perf_counter() - t0

    def _complete(self, k: int, report: HopReport | None, job_s: float) -> bool:
        """Fit ``k``'s sub-epochs of this job given its task's report (None: its partition was
        empty, one sub-epoch without samples): each visit's record and triggers, the new
        states after the last. True when its end trigger fired."""
        member = self.members[k]
        ctx = member.ctx
        if report is None:
            if member.task_scheduler == "epoch" and \
                    (ctx.iteration + 1) % ctx.plan.iterations_per_epoch == 0:
                step_task_scheduler(ctx.lr_scheduler)   # as the task steps it after a visit
            return self._after_visit(k, None, job_s, 0.0)
        raise_reported([report], f"fit {k}, sub-epoch {ctx.iteration + 1}")
        if report.nonfinite is not None:
            if report.visits:
                # fused sub-epochs trained well before it: the next job runs only them again
                # (the same bits) so that their weights are kept, and the job after it stops
                # at the failing sub-epoch, as one job per sub-epoch would
                member.cap = len(report.visits)
                log.info("fit %d: a value was not finite after %d good sub-epochs of a fused "
                         "run; they run again alone to keep their weights", k,
                         len(report.visits))
                return False
            stop_not_finite(ctx, report.nonfinite, "sub-epoch")
        visits = report.visits
        if not visits:
            raise SparkdlError(f"fit {k}: the task of partition {report.partition} trained "
                               "no sub-epoch although its shard was there")
        t_load = time.perf_counter()
        model_state, other_buffers, optimizer_state, scheduler_state = pickle.loads(report.state)
        share = job_s / len(visits)
        for j, visit in enumerate(visits):
            last = j == len(visits) - 1
            if last:                    # the states after the job's last visit
                with one_update_thread():
                    ctx.model.load_state_dict(model_state)
                    load_non_persistent_buffers(ctx.model, other_buffers)
                    ctx.optimizer.load_state_dict(optimizer_state)
                    if scheduler_state is not None:
                        ctx.lr_scheduler.load_state_dict(scheduler_state)
            ended = self._after_visit(k, visit, share, time.perf_counter() - t_load
                                      if last else 0.0, report.rss_bytes, last)
            if ended and not last:
                raise SparkdlError(
                    f"fit {k}: its end trigger fired inside a run of fused sub-epochs "
                    f"(after sub-epoch {ctx.iteration}); a trigger sparkdl took for one that "
                    "fires only at epoch ends or counts fired elsewhere")
            if ended:
                return True
        return False

    def _after_visit(self, k: int, visit: VisitRecord | None, wall_s: float, update_s: float,
                     rss_bytes: int = 0, last: bool = True) -> bool:
        """One sub-epoch of fit ``k`` done: its record, the driver's scheduler step at an
        epoch's end (a metric scheduler), validation, checkpoints and the triggers (only
        after a job's last visit may they act: :func:`horizon` ends a job's run where one
        could). True when the end trigger fired."""
        member = self.members[k]
        ctx, life = member.ctx, member.lifecycle
        per_epoch = ctx.plan.iterations_per_epoch
        epoch = ctx.iteration // per_epoch
        ctx.iteration += 1
        epoch_finished = ctx.iteration % per_epoch == 0
        samples = visit.samples if visit is not None else 0
        loss = visit.loss_sum / samples if samples else math.nan
        compute_s = visit.compute_s if visit is not None else 0.0
        record = IterationRecord(
            iteration=ctx.iteration, epoch=epoch + 1, records=samples, loss=loss,
            learning_rate=float(ctx.optimizer.param_groups[0]["lr"]),
            samples_per_s=samples / wall_s if wall_s > 0 else 0.0, wall_s=wall_s,
            compute_s=compute_s, reduce_s=0.0, update_s=update_s, broadcast_s=0.0,
            other_s=max(0.0, wall_s - compute_s - update_s),
            driver_rss_bytes=current_rss_bytes(), worker_rss_bytes=rss_bytes)
        life.record(record)
        state = TrainingState(ctx.iteration, epoch + int(epoch_finished), epoch_finished,
                              loss=loss if samples else None, metrics=dict(life.metrics))
        if not last:
            return ctx.end_trigger(state)
        return life.finish_iteration(state, epoch, loss,
                                     lambda: ctx.layout.state_vector(ctx.model),
                                     epoch_finished and member.driver_scheduler, "sub-epochs")

