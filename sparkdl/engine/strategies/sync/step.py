"""The synchronous SGD step of one fit (driver side): one job per iteration, the user's
optimizer on the driver.

Each iteration: the plan says which samples every partition takes
(:class:`sparkdl.data.batch_plan.BatchPlan`); the runner runs the job and returns the sum over
partitions of ``(|B_i| / |B|) * grad on B_i`` with the tasks' reports
(:mod:`sparkdl.runners.interface`); the step stops on a non-finite loss or gradient, puts the
sum into ``p.grad`` (None for parameters no task gave a gradient), combines the buffers the tasks
changed (:func:`sparkdl.transport.flat_layout.combine_buffers`), clips the gradient if asked,
calls ``optimizer.step()`` (with a closure that runs one more job per evaluation for closure
optimizers such as LBFGS) and the LR scheduler, records the iteration, and hands the rest to the
fit's lifecycle (:mod:`sparkdl.engine.fit.lifecycle`: validation, checkpoints, triggers, best
weights). It never touches Spark.

Example::

    step = SyncStep(ctx, FitLifecycle(ctx))
    if step.start():
        spec, weights = step.request()
        ended = step.complete(runner.gradients(ctx.train, spec, weights))
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from typing import Any

import numpy as np
import torch

from ....errors import SparkdlError, TrainingDataError, TrainingStepError, raise_reported
from ....executor.process_memory import current_rss_bytes
from ....executor.step import StepSpec
from ....transport.allreduce import AllReduceResult
from ....transport.flat_layout import combine_buffers, summed_presence
from ....transport.table_rows import gather_rows, rows_finite, scale_rows
from ....transport.weight_refresh import DriverWeights, StateVersion, row_local_tables
from ....triggers import TrainingState
from ...fit.lifecycle import FitLifecycle, stop_not_finite
from ...fit.optim.optimizer_sequence import needs_closure, optimizer_members
from ...fit.optim.update_threads import one_update_thread
from ...fit.recovery import run_with_recovery
from ...fit.reports.summary import IterationRecord
from ...fit.run_context import RunContext

__all__ = ["SyncStep"]

log = logging.getLogger("sparkdl")


def _normalize(result: AllReduceResult, batch_size: int, what: str, weighted: bool,
               step: bool = False) -> None:
    """Losses whose normaliser is not the row count (sample weights, masked or class-weighted
    losses: :mod:`sparkdl.losses`): the tasks summed the loss terms and the gradient of that sum
    divided by the batch size, and reported their normalisers; dividing by the union batch's
    normaliser (over the batch size) gives the single-process mean loss and its gradient."""
    total = math.fsum(r.normaliser for r in result.reports)
    if not total > 0:     # the data's fault (weights, labels), or the step's
        raise (TrainingStepError if step and not weighted else TrainingDataError)(
            f"{what}: the sample weights of the batch sum to {total}; weights must be >= 0 "
            "with a positive sum in every batch (all-zero weights train nothing)" if weighted else
            f"{what}: the training step's normalisers over the batch sum to {total}: no term of "
            "the batch counts, so its mean loss is undefined. Check the labels' padding, or use "
            "a larger batch." if step else
            f"{what}: the loss's normaliser over the batch is {total}: every target of the "
            "batch is ignored (ignore_index) or has class weight 0, so its mean loss is "
            "undefined (NaN in torch). Check the labels' padding, or use a larger batch.")
    assert result.vector is not None
    np.divide(result.vector, total / batch_size, out=result.vector, casting="unsafe")
    if result.rows:     # the same division as the vector's (bitwise the dense result)
        result.rows = {k: (ids, np.divide(values, total / batch_size).astype(values.dtype,
                                                                               copy=False))
                       for k, (ids, values) in result.rows.items()}
    for r in result.reports:
        r.loss /= total


def _batch_loss(result: AllReduceResult) -> float:
    """The union batch's loss: the tasks' weighted parts, summed exactly."""
    return float(math.fsum(r.loss for r in result.reports))


class SyncStep:
    """One fit's synchronous SGD iterations, from its current one (see the module
    docstring); ``lifecycle`` is the fit's own."""

    def __init__(self, ctx: RunContext, lifecycle: FitLifecycle) -> None:
        self.ctx = ctx
        self.lifecycle = lifecycle
        self._devices: set[str] = set()
        self._skipped = False
        self._used_scale = 0.0
        self._closure = needs_closure(ctx.optimizer)

    def start(self) -> bool:
        """Before the first iteration: False when the fit had ended already (a resumed run),
        else its lifecycle starts and the weights to ship are taken."""
        if not self.lifecycle.start():
            return False
        self._weights = DriverWeights(self.ctx.layout, self.ctx.model, self._row_local(),
                                      bind=self._binds())
        self._next_weights = self._weights.current()
        return True

    def close(self) -> None:
        """After the last iteration or a failure."""
        self.lifecycle.close()

    def request(self) -> tuple[StepSpec, StateVersion]:
        """The next iteration's step and weights: what its gradient job computes."""
        self._epoch_step = self.ctx.plan.epoch_and_step(self.ctx.iteration)
        self._spec = self._step_spec(*self._epoch_step)
        self._t_start = time.perf_counter()
        self._rebuilt_before = self.ctx.train.shards_rebuilt
        return self._spec, self._next_weights

    def job_name(self) -> str:
        """The next iteration, for logs and errors."""
        return f"iteration {self.ctx.iteration + 1}"

    def _step_spec(self, epoch: int, step: int) -> StepSpec:
        ctx = self.ctx
        starts, counts = ctx.plan.shares(epoch, step)
        options = ctx.settings.runner_options
        return StepSpec(ctx.settings.seed, ctx.settings.shuffle, ctx.iteration, epoch, starts,
                        counts, ctx.plan.batch_size_at(step), ctx.settings.micro_batch_size,
                        ctx.layout.fingerprint, options.device, options.precision,
                        ctx.loss_scaler.scale if ctx.loss_scaler is not None else 1.0,
                        ctx.settings.sub_replicas)

    def _gradients(self, step: StepSpec, weights: StateVersion) -> AllReduceResult:
        """A gradient job of this fit alone (a closure optimizer's later evaluations)."""
        ctx = self.ctx
        result = run_with_recovery(
            ctx.runner, ctx.train, lambda: ctx.runner.gradients(ctx.train, step, weights),
            lambda r: r.missing_partitions, self.job_name())
        return self.checked(step, result)

    def checked(self, step: StepSpec, result: AllReduceResult) -> AllReduceResult:
        """A job's result for this fit, its tasks' errors raised and its sums normalised."""
        ctx = self.ctx
        # raised in a task, a retry cannot fix it: reported, raised here as itself
        raise_reported(result.reports, self.job_name())
        if result.vector is None:
            raise SparkdlError(f"{self.job_name()}: no partition produced a gradient")
        if ctx.layout.tables and result.rows is None:
            result.rows = gather_rows(result.reports, ctx.layout.numpy_dtype)
        if ctx.settings.sample_weights or ctx.normalised_loss:
            _normalize(result, step.batch_size, self.job_name(),
                       ctx.settings.sample_weights, ctx.training_step is not None)
        devices = sorted({r.device for r in result.reports if r.count} - self._devices)
        if devices:
            self._devices.update(devices)
            log.info("tasks compute on %s", ", ".join(devices))
        retried = [r.partition for r in result.reports if r.attempt > 0]
        if retried:
            log.warning("tasks of partitions %s were retried by Spark; the result is unchanged "
                        "(tasks are deterministic)", retried)
        return result

    def complete(self, result: AllReduceResult) -> bool:
        """The iteration :meth:`request` asked for, given its job's result (not yet
        :meth:`checked`): the update, the record, validation, checkpoints and the triggers.
        True when the end trigger fired (the fit is done)."""
        ctx = self.ctx
        life = self.lifecycle
        spec, t_start = self._spec, self._t_start
        per_epoch = ctx.plan.iterations_per_epoch
        epoch, step = self._epoch_step
        state_vector = self._next_weights.state
        result = self.checked(spec, result)
        t_update = time.perf_counter()
        loss = _batch_loss(result)
        lr = float(ctx.optimizer.param_groups[0]["lr"])
        if ctx.loss_scaler is None:
            self._stop_if_not_finite(loss, result.vector, result.rows)
        local_before = self._row_local()
        epoch_finished = step == per_epoch - 1
        scheduler_due = ctx.lr_scheduler is not None and (
            ctx.settings.lr_scheduler_step == "iteration" or epoch_finished)
        with one_update_thread():    # the same bits on any driver (update_threads)
            self._update(spec, state_vector, result)
            if scheduler_due and not life.metric_scheduler:
                ctx.lr_scheduler.step()
        weights = self._refreshed(result, local_before)
        self._next_weights = weights
        state_vector = weights.state
        update_s = time.perf_counter() - t_update
        ctx.iteration += 1
        state = TrainingState(ctx.iteration, epoch + int(epoch_finished), epoch_finished,
                              loss=loss, metrics=dict(life.metrics))
        record = self._record(result, epoch, spec.batch_size, loss, lr, update_s,
                              time.perf_counter() - t_start,
                              ctx.train.shards_rebuilt - self._rebuilt_before)
        log.debug("epoch %d iteration %d (%d/%d): records %d, loss %.6g, %.0f samples/s",
                  epoch + 1, ctx.iteration, step + 1, per_epoch, spec.batch_size, loss,
                  record.samples_per_s)
        return life.finish_iteration(state, epoch, loss, lambda: state_vector,
                                     scheduler_due and life.metric_scheduler)

    # ------------------------------------------------------------------ the weights' refresh
    def _binds(self) -> bool:
        """Whether the model's parameters become views of the state vector (the weights held
        once on the driver): not for a closure optimizer, whose step restores the state from
        before it after a non-finite trial (the state must not move with the parameters)."""
        return not self._closure

    def _row_local(self) -> set[int]:
        ctx = self.ctx
        return set(row_local_tables(ctx.layout, ctx.model, optimizer_members(ctx.optimizer)))

    def _refreshed(self, result: AllReduceResult, local_before: set[int]) -> StateVersion:
        """The state after this iteration's step. The tables that travel as row deltas are
        those row-local both before the step and now (a scheduler or the user may change an
        optimizer's momentum or weight decay); when that set changes the state is taken anew
        and the next refresh is a full copy."""
        ctx = self.ctx
        local = self._row_local() & local_before
        if local != set(self._weights.row_local):
            log.info("iteration %d: the tables sent as row deltas are now %s (an optimizer's "
                     "settings changed); the weights are sent whole once", ctx.iteration + 1,
                     [ctx.layout.params[k].name for k in sorted(local)] or "none")
            self._weights = DriverWeights(ctx.layout, ctx.model, sorted(local),
                                          self._weights.version + 1, bind=self._binds())
            return self._weights.current()
        return self._weights.advance(ctx.model, result.rows)

    # ------------------------------------------------------------------ the update
    def _load_sum(self, spec: StepSpec, state_vector: np.ndarray,
                  result: AllReduceResult) -> None:
        """The summed gradient into ``p.grad`` (None where no task produced one), the tasks'
        buffers combined into the model's, then clipping."""
        ctx = self.ctx
        assert result.vector is not None
        present = summed_presence((r.grad_present for r in result.reports),
                                  len(ctx.layout.params))
        ctx.layout.set_grads(ctx.model, result.vector, present, result.rows)
        changes = [(r.count / spec.batch_size, r.buffers) for r in result.reports if r.count]
        ctx.layout.set_buffers(ctx.model, combine_buffers(ctx.layout, state_vector, changes))
        if ctx.clipping is not None:
            ctx.clipping.apply(ctx.model)

    def _update(self, spec: StepSpec, state_vector: np.ndarray, first: AllReduceResult) -> None:
        ctx = self.ctx
        if ctx.loss_scaler is not None:
            self._scaled_update(spec, state_vector, first)
            return
        if not self._closure:
            self._load_sum(spec, state_vector, first)
            ctx.optimizer.step()
            ctx.optimizer.zero_grad(set_to_none=True)
            return
        pending: list[AllReduceResult] = [first]
        before = copy.deepcopy(ctx.optimizer.state_dict())

        def closure() -> torch.Tensor:
            # The first evaluation is the job already run; every later one is a new job on the
            # same union batch with the weights the optimizer is trying.
            if pending:
                result, weights = pending.pop(), state_vector
            else:
                trial = self._weights.reset(ctx.model)      # the weights the optimizer tries
                weights = trial.state
                result = self._gradients(spec, trial)
                loss = _batch_loss(result)
                if not (math.isfinite(loss) and np.isfinite(result.vector).all()
                        and rows_finite(result.rows)):
                    # back to the state before this step, then the NaN policy
                    ctx.layout.load_state(ctx.model, state_vector)
                    ctx.optimizer.load_state_dict(before)
                    self._stop_if_not_finite(loss, result.vector, result.rows)
            self._load_sum(spec, weights, result)
            return torch.tensor(_batch_loss(result), dtype=torch.float64)

        ctx.optimizer.step(closure)
        ctx.optimizer.zero_grad(set_to_none=True)

    def _scaled_update(self, spec: StepSpec, state_vector: np.ndarray,
                       result: AllReduceResult) -> None:
        """``precision="16-mixed"``: GradScaler's rules on the summed, scaled gradient."""
        ctx = self.ctx
        scaler = ctx.loss_scaler
        vector = result.vector
        assert vector is not None
        rows = result.rows
        found_inf = not (np.isfinite(vector).all() and rows_finite(rows))
        self._skipped = found_inf
        self._used_scale = scaler.scale
        if found_inf:
            if scaler.scale < 2.0 ** -14:      # no scale helps: a real NaN, not an overflow
                self._stop_if_not_finite(_batch_loss(result), vector, rows)
            log.warning("iteration %d: the gradient at loss scale %g has inf or NaN values; the "
                        "step is skipped and the scale halved", ctx.iteration + 1, scaler.scale)
            vector = np.zeros_like(vector)
            rows = scale_rows(rows, 0.0) if rows else rows
        else:
            vector = vector * scaler.inverse()
            rows = scale_rows(rows, scaler.inverse()) if rows else rows
        self._load_sum(spec, state_vector, dataclasses.replace(result, vector=vector,
                                                               rows=rows))
        if not found_inf:
            ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
        scaler.update(found_inf)

    def _record(self, result: AllReduceResult, epoch: int, records: int, loss: float,
                lr: float, update_s: float, wall: float, rebuilt: int) -> IterationRecord:
        compute_s = max((r.compute_s for r in result.reports), default=0.0)
        spans = result.timeline()
        record = IterationRecord(
            iteration=self.ctx.iteration, epoch=epoch + 1, records=records, loss=loss,
            learning_rate=lr, samples_per_s=records / wall, wall_s=wall,
            compute_s=compute_s, reduce_s=result.reduce_s, update_s=update_s,
            broadcast_s=result.broadcast_s,
            other_s=max(0.0, wall - compute_s - result.reduce_s - update_s - result.broadcast_s
                        - sum(spans.values())),
            driver_rss_bytes=current_rss_bytes(),
            worker_rss_bytes=max((r.rss_bytes for r in result.reports), default=0),
            loss_scale=self._used_scale,
            step_skipped=self._skipped, shards_rebuilt=rebuilt,
            executors={r.partition: r.executor for r in result.reports
                       if getattr(r, "executor", "")}, **spans)
        self.lifecycle.record(record)
        return record

    def _stop_if_not_finite(self, loss: float, vector: np.ndarray,
                            rows: dict[int, Any] | None = None) -> None:
        """The NaN policy: stop with the last good weights (and a checkpoint of them)."""
        ctx = self.ctx
        params = vector[:ctx.layout.num_param_values]
        if math.isfinite(loss) and np.isfinite(params).all() and rows_finite(rows):
            return
        bad = int((~np.isfinite(params)).sum()) + sum(
            int((~np.isfinite(values)).sum()) for _, values in (rows or {}).values())
        stop_not_finite(ctx, f"the loss is {loss}" if not math.isfinite(loss) else
                        f"the gradient has {bad} non-finite values")
