"""Local rounds' jobs: H iterations per Spark job for every fit of a pass, each partition's
optimizer trained where its shard is (driver side).

Each fit is a :class:`RoundMember`. During its synchronous warm-up it is a plain
:class:`~sparkdl.engine.strategies.sync.step.SyncStep` (one gradient job per iteration, the
fits of a pass in one job). After it, one job per round (:func:`.schedule.round_end`) trains
every partition's copy of the user's optimizer over the round's iterations
(:mod:`sparkdl.executor.round_task`), and the AllReduce sums the weighted deltas in partition
order; the driver puts the sum into ``p.grad`` of the round's weights, averages the buffers by
the same weights (:func:`sparkdl.transport.flat_layout.combine_buffers`) and steps the outer
optimizer.

Where the inner states live: beside the shards. Each partition's optimizer and scheduler state
stays on the executor that ran its task (:mod:`sparkdl.executor.round_states`), versioned by
the round's first iteration; the driver ships each round its weights (one broadcast) and gets
back the AllReduce's sums and the tasks' scalars, whatever the partitions and the optimizer. A
round's task is a pure function of the round's weights, its inner state and its shard, so a
retried or speculative task reads the same state (kept until the next round commits). A
partition whose state is not where its task ran (a lost executor, a placement miss, a resumed
driver) is rebuilt by replay from the last durable copy, which the tasks write every K rounds
where checkpoints go, with the rounds' weights that the driver keeps since
(:mod:`.state_history`); a checkpoint names those copies and holds those weights.

The fit's iteration stays the unit of its record: each of a round's iterations gets a record
(the union of the partitions' shares, its loss the inner steps' mean weighted by rows). Its
triggers are asked at the round's end: a validation, checkpoint or end trigger that fires on
any iteration of the round fires there (:meth:`FitLifecycle.finish_iteration`'s ``passed``).
A metric scheduler (``ReduceLROnPlateau`` per epoch) steps on the driver at the round that
closes an epoch, and its learning rates go into every partition's optimizer.

Example::

    members = [RoundMember(run.ctx, run.lifecycle, run.spec, settings) for run in runs]
    FitsDriver(members, RoundsJobs(members), "pass").run()
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ....errors import CheckpointError, SparkdlError, raise_reported
from ....executor.hop_task import HopBundle
from ....executor.process_memory import current_rss_bytes
from ....executor.replicas import ReplicaSpec
from ....executor.round_task import RoundSpec
from ....runners.interface import RoundEntry
from ....transport.allreduce import AllReduceResult
from ....transport.flat_layout import combine_buffers, summed_presence
from ....transport.table_rows import gather_rows
from ....triggers import TrainingState, planned_iterations
from ...fit.lifecycle import FitLifecycle, stop_not_finite
from ...fit.optim.optimizer_sequence import (needs_closure, scheduler_needs_metric,
                                              task_scheduler_step)
from ...fit.optim.update_threads import one_update_thread
from ...fit.recovery import run_with_recovery
from ...fit.reports.summary import IterationRecord
from ...fit.run_context import RunContext
from ...fit.optim.outer_optimizer import outer_optimizer
from ..sync.pass_jobs import PassJobs
from ..sync.step import SyncStep
from .schedule import ends_a_round, in_warmup, longest_round, round_end, round_start
from .state_history import StateHistory

__all__ = ["RoundSettings", "RoundMember", "RoundsJobs"]

log = logging.getLogger("sparkdl")


@dataclass(frozen=True)
class RoundSettings:
    """A fit's local rounds: ``local_steps`` (H), ``outer`` (the outer optimizer as given)
    and ``warmup`` (synchronous iterations first)."""

    local_steps: int
    outer: Any
    warmup: int


class RoundMember:
    """One fit trained in local rounds (see the module docstring)."""

    def __init__(self, ctx: RunContext, lifecycle: FitLifecycle, spec: ReplicaSpec,
                 settings: RoundSettings) -> None:
        self.ctx = ctx
        self.lifecycle = lifecycle
        self.spec = spec
        self.settings = settings
        self.sync = SyncStep(ctx, lifecycle)
        self.history: StateHistory | None = None
        """Where the partitions' states are durable and the rounds since (set at start)."""
        self.lrs: tuple[float, ...] | None = None
        """Learning rates a driver-side scheduler set for the partitions' next round."""
        self.replay_next = False      # rebuild every partition's state in the next round
        self.outer: Any = None
        self._bundle: bytes | None = None
        self._planned = planned_iterations(ctx.end_trigger, ctx.plan.iterations_per_epoch)

    # ------------------------------------------------------------------ the fit's run
    def start(self) -> bool:
        """Before the first job: False when the fit had ended already (a resumed run)."""
        if not self.sync.start():
            return False
        ctx = self.ctx
        self._check_resumed_round()
        self._tell_round_lengths()
        self.outer = outer_optimizer(self.settings.outer, [
            p for p in ctx.model.parameters() if p.requires_grad])
        self.history = StateHistory.for_fit(ctx)
        resumed = ctx.resumed_strategy_state
        if resumed is not None:
            if "inner" in resumed:
                raise CheckpointError(
                    "This rounds checkpoint keeps the partitions' optimizer states as pickled "
                    "bytes (written by an older sparkdl); resuming it would unpickle what the "
                    "checkpoint directory holds. Start the fit in a new checkpoint directory.")
            if resumed.get("history") is not None:
                self.history.load_state_dict(resumed["history"])
                self.replay_next = self.history.round_index > 0
            lrs = resumed.get("lrs")
            self.lrs = None if lrs is None else tuple(float(v) for v in lrs)
            if resumed.get("outer") is not None:
                self.outer.load_state_dict(resumed["outer"])
            ctx.resumed_strategy_state = None
        ctx.strategy_state = self
        return True

    def _check_resumed_round(self) -> None:
        """A checkpoint taken where this fit's rounds do not end (its run's last round, cut
        by a shorter end trigger) is refused before any job: training on from it would split
        one of this fit's rounds in two, which a fresh fit of these settings never does."""
        ctx, settings = self.ctx, self.settings
        per_epoch, done = ctx.plan.iterations_per_epoch, ctx.iteration
        if ends_a_round(done, per_epoch, settings.local_steps, settings.warmup, self._planned):
            return
        first = round_start(done - 1, per_epoch, settings.local_steps, settings.warmup)
        last = round_end(done - 1, per_epoch, settings.local_steps, settings.warmup,
                         self._planned)
        store = ctx.checkpoints.store if ctx.checkpoints is not None else None
        name = store.file_name(done) if store is not None else f"at iteration {done}"
        earlier = [i for i in (store.iterations() if store is not None else []) if i < done
                   and ends_a_round(i, per_epoch, settings.local_steps, settings.warmup,
                                    self._planned)]
        instead = (f"Remove {name} to resume from the checkpoint at iteration {earlier[-1]} "
                   "(where this fit's rounds end), or train the longer fit from the start in "
                   "a new checkpoint directory" if earlier else
                   "Train the longer fit from the start in a new checkpoint directory")
        raise CheckpointError(
            f"The checkpoint {name} is at iteration {done}, inside one of this fit's local "
            f"rounds (iterations {first + 1}-{last}, local_steps={settings.local_steps}): the "
            "run that wrote it ended there because its end trigger cut that round short. "
            "Going on from it would train two rounds where this fit trains one, so the "
            f"result would not be this fit's. {instead}; and end a fit you mean to train "
            f"longer where its rounds end: here at iteration {first} or {last} (MaxEpoch, or "
            "a MaxIteration that falls on a round's end). Nothing has trained yet.")

    def _tell_round_lengths(self) -> None:
        """Say once when the fit's rounds are shorter than ``local_steps`` throughout (an
        epoch, or the whole fit after its warm-up, is shorter)."""
        settings, per_epoch = self.settings, self.ctx.plan.iterations_per_epoch
        steps, warmup = settings.local_steps, settings.warmup
        longest = longest_round(per_epoch, steps, warmup, self._planned)
        if not longest or longest >= steps:
            return
        if longest_round(per_epoch, steps, warmup, None) == longest:
            why = (f"a round never crosses an epoch's end, and an epoch has {per_epoch} "
                   "iterations" + (f" ({warmup} of them the synchronous warm-up's)"
                                   if warmup and warmup < per_epoch else ""))
        else:
            why = (f"the end trigger ends the fit at iteration {self._planned}"
                   + (f", {warmup} iterations of them the synchronous warm-up's"
                      if warmup else ""))
        log.warning("local_steps=%d, but this fit's rounds take at most %d iterations: %s",
                    steps, longest, why)

    def close(self) -> None:
        self.sync.close()
        if self.history is not None:
            self.history.close()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the rounds (tensors and plain values, taken at a round's
        end): where the partitions' states are durable and the rounds since
        (:class:`.state_history.StateHistory`), the learning rates set for the next round and
        the outer optimizer's state."""
        return {"history": self.history.state_dict() if self.history is not None else None,
                "lrs": None if self.lrs is None else list(self.lrs),
                "outer": self.outer.state_dict() if self.outer is not None else None}

    @property
    def warming(self) -> bool:
        """Whether the next iteration is one of the synchronous warm-up's."""
        return in_warmup(self.ctx.iteration, self.settings.warmup)

    # ------------------------------------------------------------------ a round
    def request(self, fit: int) -> RoundEntry:
        """The next round's entry (``fit``: the fit's number on the pass's runner)."""
        ctx = self.ctx
        plan = ctx.plan
        scheduler = task_scheduler_step(ctx.lr_scheduler, ctx.settings.lr_scheduler_step)
        first = ctx.iteration
        end = round_end(first, plan.iterations_per_epoch, self.settings.local_steps,
                        self.settings.warmup, self._planned)
        counts_all = [s.count for s in ctx.train.summaries]
        if self._bundle is None:     # the first round's partitions start from its optimizer
            from pyspark import cloudpickle

            self._bundle = cloudpickle.dumps(HopBundle(
                self.spec, ctx.optimizer, ctx.lr_scheduler if scheduler else None,
                ctx.clipping))
        iterations = list(range(first, end))
        epochs, starts, shares, ends = [], [], [], []
        for t in iterations:
            epoch, step = plan.epoch_and_step(t)
            s, c = plan.shares(epoch, step)
            epochs.append(epoch)
            starts.append(s)
            shares.append(c)
            ends.append(step == plan.iterations_per_epoch - 1)
        shares_arr = np.stack(shares).astype(np.int64)
        options = ctx.settings.runner_options
        spec = RoundSpec(
            ctx.settings.seed, ctx.settings.shuffle, tuple(iterations), tuple(epochs),
            tuple(ends), np.stack(starts).astype(np.int64), shares_arr, shares_arr.sum(0),
            ctx.settings.micro_batch_size, options.precision, options.device, scheduler,
            scheduler == "iteration" and scheduler_needs_metric(ctx.lr_scheduler),
            needs_closure(ctx.optimizer))
        assert self.history is not None
        spec = dataclasses.replace(
            self.history.stamp(spec), lrs=self.lrs,
            stateless=tuple(p for p, n in enumerate(counts_all) if not n))
        self._start_vector = ctx.layout.state_vector(ctx.model)
        self._spec = spec
        return RoundEntry(fit, spec, self._start_vector, self._bundle,
                          self.history.replay() if self.replay_next else None)

    def lost_states(self, result: AllReduceResult) -> list[int]:
        """The partitions whose state was not where their task ran; the next attempt of the
        round rebuilds them (:meth:`request` then ships the replay)."""
        lost = [r.partition for r in result.reports if getattr(r, "missing_state", False)]
        if lost:
            log.warning("%s: the optimizer states of partitions %s were not on the executors "
                        "that ran them; rebuilding them from their durable copy and %d "
                        "round(s) since", self.job_name(), lost,
                        len(self.history.rounds) if self.history is not None else 0)
            self.replay_next = True
        return lost

    def job_name(self) -> str:
        spec = self._spec
        return (f"round of iterations {spec.iterations[0] + 1}-{spec.iterations[-1] + 1}")

    def complete(self, result: AllReduceResult, job_s: float) -> bool:
        """The round's result: the outer step, each iteration's record, then validation,
        checkpoints and the triggers at the round's end. True when the fit ended."""
        ctx = self.ctx
        what = self.job_name()
        raise_reported(result.reports, what)
        bad = next((r for r in result.reports if getattr(r, "nonfinite", None)), None)
        if bad is not None:
            stop_not_finite(ctx, bad.nonfinite, "round starting at iteration")
        retried = [r.partition for r in result.reports if r.attempt > 0]
        if retried:
            log.warning("%s: tasks of partitions %s were retried by Spark; the result is "
                        "unchanged (each starts from the round's weights and its inner state)",
                        what, retried)
        if result.vector is None:
            raise SparkdlError(f"{what}: no partition trained in the round")
        t_update = time.perf_counter()
        assert self.history is not None
        self.history.committed(self._spec, self._start_vector)
        self.replay_next = False
        self.lrs = None
        with one_update_thread():
            self._outer_step(result)
        update_s = time.perf_counter() - t_update
        return self._finish(result, job_s, update_s)

    def _outer_step(self, result: AllReduceResult) -> None:
        """The averaged delta into ``p.grad`` of the round's weights (every trainable
        parameter, dense), the buffers averaged, one outer step."""
        ctx, spec = self.ctx, self._spec
        layout = ctx.layout
        rows = result.rows
        if layout.tables and rows is None:
            rows = gather_rows(result.reports, layout.numpy_dtype)
        present = summed_presence((r.grad_present for r in result.reports),
                                  len(layout.params))
        layout.set_grads(ctx.model, result.vector, present, rows)
        for p in ctx.model.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        total = spec.total
        changes = [(r.count / total, r.buffers) for r in result.reports if r.count]
        layout.set_buffers(ctx.model, combine_buffers(layout, self._start_vector, changes))
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)

    def _finish(self, result: AllReduceResult, job_s: float, update_s: float) -> bool:
        ctx, life, spec = self.ctx, self.lifecycle, self._spec
        reports = [r for r in result.reports if getattr(r, "loss_sums", None)]
        trained = [r for r in reports if r.partition not in spec.stateless]
        lrs = trained[0].lrs if trained and trained[0].lrs else []
        share = job_s / len(spec.iterations)
        compute = max((r.compute_s for r in result.reports), default=0.0) / len(spec.iterations)
        passed: list[TrainingState] = []
        for j, t in enumerate(spec.iterations):
            rows = sum(r.rows[j] for r in reports if j < len(r.rows))
            loss = (math.fsum(r.loss_sums[j] for r in reports if j < len(r.loss_sums)) / rows
                    if rows else math.nan)
            epoch = spec.epochs[j]
            last = j == len(spec.iterations) - 1
            ctx.iteration = t + 1
            record = IterationRecord(
                iteration=t + 1, epoch=epoch + 1, records=rows, loss=loss,
                learning_rate=float(lrs[j]) if j < len(lrs) else
                float(ctx.optimizer.param_groups[0]["lr"]),
                samples_per_s=rows / share if share > 0 else 0.0, wall_s=share,
                compute_s=compute, reduce_s=result.reduce_s / len(spec.iterations),
                update_s=update_s if last else 0.0,
                broadcast_s=result.broadcast_s / len(spec.iterations),
                other_s=max(0.0, share - compute), driver_rss_bytes=current_rss_bytes(),
                worker_rss_bytes=max((r.rss_bytes for r in result.reports), default=0))
            life.record(record)
            state = TrainingState(t + 1, epoch + int(spec.epoch_ends[j]), spec.epoch_ends[j],
                                  loss=loss if rows else None, metrics=dict(life.metrics))
            if not last:
                passed.append(state)
                continue
            metric_step = spec.epoch_ends[j] and life.metric_scheduler and \
                ctx.settings.lr_scheduler_step == "epoch"
            ended = life.finish_iteration(state, epoch, loss,
                                          lambda: ctx.layout.state_vector(ctx.model),
                                          metric_step, "iterations", passed)
            if metric_step:
                self._push_learning_rates()
            return ended
        return False

    def _push_learning_rates(self) -> None:
        """A metric scheduler stepped on the driver: its learning rates go into every
        partition's optimizer at the next round's start (the round's spec carries them)."""
        self.lrs = tuple(float(group["lr"]) for group in self.ctx.optimizer.param_groups)


class RoundsJobs:
    """The jobs of fits trained in local rounds (see the module docstring): per driver turn,
    one gradient job for the fits in their warm-up and one round job for the others."""

    def __init__(self, members: Sequence[RoundMember]) -> None:
        self.members = list(members)
        self.sync = PassJobs([m.sync for m in self.members])
        self._rounds = 0

    @property
    def jobs(self) -> int:
        return self.sync.jobs + self._rounds

    def starting(self, active: list[int]) -> None:
        """Nothing to prepare: each round ships its weights and states with its request."""

    def iteration(self, active: list[int]) -> dict[int, Callable[[], bool]]:
        warm = [k for k in active if self.members[k].warming]
        rounds = [k for k in active if k not in warm]
        completions: dict[int, Callable[[], bool]] = {}
        if warm:
            completions.update(self.sync.iteration(warm))
        if rounds:
            results, job_s = self._round_job(rounds)
            for k, result in zip(rounds, results):
                completions[k] = (lambda k=k, result=result:
                                  self.members[k].complete(result, job_s))
        return completions

    def _round_job(self, active: list[int]) -> tuple[list[AllReduceResult], float]:
        t0 = time.perf_counter()
        self._rounds += 1
        first = self.members[active[0]]
        views = [self.members[k].ctx.runner for k in active]
        runner = views[0].runner
        entries = [self.members[k].request(view.fit) for k, view in zip(active, views)]
        what = (first.job_name() if len(active) == 1 else
                f"the pass's round job {self._rounds} ({len(active)} fits)")
        for _ in range(2):     # a second time when partitions' states had to be rebuilt
            results = run_with_recovery(
                views[0], first.ctx.train,
                lambda: runner.rounds_together(first.ctx.train, entries),
                lambda rs: sorted({p for r in rs for p in r.missing_partitions}), what)
            lost = [k for k, result in zip(active, results)
                    if self.members[k].lost_states(result)]
            if not lost:
                return results, time.perf_counter() - t0
            entries = [self.members[k].request(view.fit) for k, view in zip(active, views)]
        raise SparkdlError(f"{what}: the partitions' optimizer states were lost again while "
                           "they were rebuilt")
