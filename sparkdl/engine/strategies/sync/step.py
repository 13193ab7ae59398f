"""The synchronous SGD loop (driver side): one job per iteration, the user's optimizer on the
driver.

Each iteration: the plan says which samples every partition takes
(:class:`sparkdl.data.batch_plan.BatchPlan`); the runner runs the job and returns the sum over
partitions of ``(|B_i| / |B|) * grad on B_i`` with the tasks' reports
(:mod:`sparkdl.runners.interface`); the loop stops on a non-finite loss or gradient, puts the
sum into ``p.grad`` (None for parameters no task gave a gradient), combines the buffers the tasks
changed (:func:`sparkdl.transport.flat_layout.combine_buffers`), clips the gradient if asked,
calls ``optimizer.step()`` (with a closure that runs one more job per evaluation for closure
optimizers such as LBFGS) and the LR scheduler, records the iteration, and asks the triggers
whether to validate, checkpoint or stop (restoring the best weights for an early stop). It never
touches Spark.

Example::

    TrainingLoop(ctx).run()       # ctx: a sparkdl.engine.fit.run_context.RunContext
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from typing import Any, Callable

import numpy as np
import torch

from ....errors import (NonFiniteError, SparkdlError, TrainingDataError, TrainingStepError,
                      raise_reported)
from ....executor.process_memory import current_rss_bytes
from ....executor.step import StepSpec
from ....transport.allreduce import AllReduceResult
from ....transport.flat_layout import combine_buffers, summed_presence
from ....transport.table_rows import gather_rows, rows_finite, scale_rows
from ....transport.weight_refresh import DriverWeights, StateVersion, row_local_tables
from ....triggers import EarlyStopping, TrainingState, planned_iterations
from ...fit.optim.optimizer_sequence import needs_closure, optimizer_members, scheduler_needs_metric
from .pass_jobs import PassLoop
from ...fit.reports.progress import ProgressReporter
from ...fit.recovery import run_with_recovery
from ...fit.run_context import RunContext
from ...fit.reports.summary import IterationRecord
from ...fit.optim.update_threads import one_update_thread

__all__ = ["TrainingLoop", "stop_not_finite"]

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


def stop_not_finite(ctx: RunContext, what: str, unit: str = "iteration") -> None:
    """The NaN policy: stop with the last good weights (the model's now, also checkpointed when
    the run checkpoints) in a :class:`NonFiniteError`; ``what`` was not finite in ``unit``
    ``ctx.iteration + 1``."""
    path = ctx.checkpoints.write(ctx) if ctx.checkpoints is not None else None
    good = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
    message = (f"Training stopped at {unit} {ctx.iteration + 1}: {what}. The model keeps the "
               f"last good weights (after {unit} {ctx.iteration}); they are in this error's "
               "state_dict" + (f" and in checkpoint {path}" if path else "") +
               ". Lower the learning rate, clip gradients or check the data.")
    log.error("%s", message)
    raise NonFiniteError(message, ctx.iteration + 1, good, path)


class TrainingLoop:
    """Runs ``ctx`` from its current iteration until the end trigger fires."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._metrics: dict[str, float] = (dict(ctx.summary.validations[-1].metrics)
                                           if ctx.summary.validations else {})
        self._devices: set[str] = set()
        self._skipped = False
        self._used_scale = 0.0
        self._closure = needs_closure(ctx.optimizer)
        self._metric_scheduler = scheduler_needs_metric(ctx.lr_scheduler)
        self._reporter: ProgressReporter | None = None
        self._iteration_level = logging.INFO

    def run(self) -> None:
        """Train this fit alone: a pass of one (:class:`sparkdl.engine.strategies.sync.pass_jobs.PassLoop`)."""
        PassLoop([self]).run()

    def start(self) -> bool:
        """Before the first iteration: False when the end trigger had already fired (a resumed
        run that had ended), else the progress reporting starts and the loop is ready."""
        ctx = self.ctx
        per_epoch = ctx.plan.iterations_per_epoch
        if ctx.validation is not None:
            ctx.validation.warn_about_threshold(ctx)
        if ctx.iteration > 0:
            last = ctx.summary.iterations[-1].loss if ctx.summary.iterations else None
            state = TrainingState(ctx.iteration, ctx.iteration // per_epoch,
                                  ctx.iteration % per_epoch == 0, last, dict(self._metrics))
            if ctx.end_trigger(state):
                self.restore_best()
                log.info("the end trigger had already fired at iteration %d: nothing to train",
                         ctx.iteration)
                return False
        self._reporter = ProgressReporter(ctx.settings.progress_bar,
                                          ctx.settings.tensorboard_dir, per_epoch,
                                          planned_iterations(ctx.end_trigger, per_epoch),
                                          ctx.iteration, listeners=ctx.listeners)
        self._iteration_level = logging.DEBUG if self._reporter.console else logging.INFO
        self._weights = DriverWeights(ctx.layout, ctx.model, self._row_local())
        self._next_weights = self._weights.current()
        return True

    def close(self) -> None:
        """End the progress reporting (after the last iteration or a failure)."""
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close()

    @property
    def reporter(self) -> ProgressReporter | None:
        """The run's progress sinks, between :meth:`start` and :meth:`close`."""
        return self._reporter

    @property
    def metrics(self) -> dict[str, float]:
        """The latest validation's metrics (empty before the first)."""
        return self._metrics

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
        reporter = self._reporter
        assert reporter is not None
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
            if scheduler_due and not self._metric_scheduler:
                ctx.lr_scheduler.step()
        weights = self._refreshed(result, local_before)
        self._next_weights = weights
        state_vector = weights.state
        update_s = time.perf_counter() - t_update
        ctx.iteration += 1
        state = TrainingState(ctx.iteration, epoch + int(epoch_finished), epoch_finished,
                              loss=loss, metrics=dict(self._metrics))
        record = self._record(result, epoch, spec.batch_size, loss, lr, update_s,
                              time.perf_counter() - t_start,
                              ctx.train.shards_rebuilt - self._rebuilt_before)
        log.log(self._iteration_level,
                "epoch %d iteration %d (%d/%d): records %d, loss %.6g, %.0f samples/s",
                epoch + 1, ctx.iteration, step + 1, per_epoch, spec.batch_size, loss,
                record.samples_per_s)
        reporter.iteration(record)
        return self.finish_iteration(state, epoch, loss, lambda: state_vector,
                                     scheduler_due and self._metric_scheduler)

    def finish_iteration(self, state: TrainingState, epoch: int, loss: float,
                         weights: Callable[[], np.ndarray], metric_step: bool,
                         unit: str = "iterations") -> bool:
        """After an iteration's update and record (``state``: where training stands, ``epoch``
        the 0-based epoch it belonged to): validation with ``weights()`` when its trigger
        fires, a metric scheduler's step when ``metric_step``, the end trigger, the weights an
        early stop may restore, checkpoints. True when the end trigger fired (the best
        weights are then restored). Model hopping calls it after a sub-epoch."""
        ctx = self.ctx
        assert self._reporter is not None
        if ctx.validation is not None and ctx.validation.trigger(state):
            validation = ctx.validation.run(ctx, weights(), state)
            self._reporter.validation(validation)
            self._metrics = dict(validation.metrics)
            state = dataclasses.replace(state, metrics=dict(self._metrics), validated=True)
        if metric_step:
            ctx.lr_scheduler.step(self._scheduler_metric(state, epoch, loss))
        ended = ctx.end_trigger(state)
        self.remember_best(state)
        if ctx.checkpoints is not None and ctx.checkpoints.setup.trigger(state):
            ctx.checkpoints.write(ctx)
        if ended:
            self.restore_best()
            log.info("training finished after %d %s (%d epochs): loss %.6g", ctx.iteration,
                     unit, state.epoch, loss)
        return ended

    # ------------------------------------------------------------------ the weights' refresh
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
                                          self._weights.version + 1)
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

    def _scheduler_metric(self, state: TrainingState, epoch: int, loss: float) -> float:
        """What a scheduler whose ``step`` takes a metric (``ReduceLROnPlateau``) is given: the
        validation loss when validation ran on this iteration, else the mean training loss over
        the samples since its last step (the epoch's, or this iteration's when it steps every
        iteration)."""
        if state.validated and "Loss" in state.metrics:
            return float(state.metrics["Loss"])
        if self.ctx.settings.lr_scheduler_step == "iteration":
            return loss
        records = [r for r in self.ctx.summary.iterations if r.epoch == epoch + 1 and r.records]
        total = math.fsum(r.records for r in records)
        return math.fsum(r.loss * r.records for r in records) / total

    # ------------------------------------------------------------------ early stopping
    def remember_best(self, state: TrainingState) -> None:
        """Keep a copy of the weights an early stop may restore (only when they improved)."""
        for k, trigger in enumerate(self._early_stops()):
            if trigger.improved and trigger.restore_best:
                self.ctx.best_states[k] = {name: value.detach().clone()
                                           for name, value in self.ctx.model.state_dict().items()}

    def restore_best(self) -> None:
        for k, trigger in enumerate(self._early_stops()):
            best = self.ctx.best_states.get(k)
            if trigger.stopped and trigger.restore_best and best is not None:
                self.ctx.model.load_state_dict(best)
                log.info("early stopping on %s: restored the weights of iteration %d (%s %.6g)",
                         trigger.metric, trigger.best_iteration, trigger.metric, trigger.best)

    def _early_stops(self) -> list[EarlyStopping]:
        return [t for t in self.ctx.end_trigger.walk() if isinstance(t, EarlyStopping)]

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
        self.ctx.summary.iterations.append(record)
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
