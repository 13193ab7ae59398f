"""The synchronous SGD loop (driver side): one job per iteration, the user's optimizer on the
driver.

Each iteration: the plan says which samples every partition takes
(:class:`sparkdl.data.batch_plan.BatchPlan`); the runner runs the job and returns the sum over
partitions of ``[(|B_i| / |B|) * grad on B_i, (|B_i| / |B|) * buffers]``
(:mod:`sparkdl.runners.interface`); the loop stops on a non-finite loss or gradient, puts the
sum into ``p.grad`` and the buffers, calls ``optimizer.step()`` (and the LR scheduler), records the
iteration, and asks the triggers whether to validate, checkpoint or stop. It never touches Spark.

Example::

    TrainingLoop(ctx).run()       # ctx: a sparkdl.engine.run_context.RunContext
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from ..errors import NonFiniteError, SparkdlError
from ..executor.process_memory import current_rss_bytes
from ..executor.step import StepSpec
from ..transport.allreduce import AllReduceResult
from ..triggers import MaxEpoch, MaxIteration, TrainingState, Trigger
from .progress import ProgressReporter
from .recovery import run_with_recovery
from .run_context import RunContext
from .summary import IterationRecord

__all__ = ["TrainingLoop"]

log = logging.getLogger("sparkdl")


def _total_iterations(trigger: Trigger, iterations_per_epoch: int) -> int | None:
    """The run's last iteration when the end trigger says it in advance (for the ETA)."""
    if isinstance(trigger, MaxEpoch):
        return trigger.limit * iterations_per_epoch
    if isinstance(trigger, MaxIteration):
        return trigger.limit
    return None


class TrainingLoop:
    """Runs ``ctx`` from its current iteration until the end trigger fires."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def run(self) -> None:
        ctx = self.ctx
        per_epoch = ctx.plan.iterations_per_epoch
        if ctx.iteration > 0:
            state = TrainingState(ctx.iteration, ctx.iteration // per_epoch,
                                  ctx.iteration % per_epoch == 0)
            if ctx.end_trigger(state):
                log.info("the end trigger had already fired at iteration %d: nothing to train",
                         ctx.iteration)
                return
        reporter = ProgressReporter(ctx.settings.progress_bar, ctx.settings.tensorboard_dir,
                                    per_epoch, _total_iterations(ctx.end_trigger, per_epoch),
                                    ctx.iteration)
        try:
            self._iterate(reporter)
        finally:
            reporter.close()

    def _step_spec(self, epoch: int, step: int) -> StepSpec:
        ctx = self.ctx
        starts, counts = ctx.plan.shares(epoch, step)
        return StepSpec(ctx.settings.seed, ctx.settings.shuffle, ctx.iteration, epoch, starts,
                        counts, ctx.plan.batch_size_at(step), ctx.settings.micro_batch_size)

    def _gradients(self, step: StepSpec, weights: np.ndarray) -> AllReduceResult:
        ctx = self.ctx
        result = run_with_recovery(
            ctx.runner, ctx.train, lambda: ctx.runner.gradients(ctx.train, step, weights),
            lambda r: r.missing_partitions, f"iteration {ctx.iteration + 1}")
        if result.vector is None:
            raise SparkdlError(f"iteration {ctx.iteration + 1}: no partition produced a gradient")
        retried = [r.partition for r in result.reports if r.attempt > 0]
        if retried:
            log.warning("tasks of partitions %s were retried by Spark; the result is unchanged "
                        "(tasks are deterministic)", retried)
        return result

    def _iterate(self, reporter: ProgressReporter) -> None:
        ctx = self.ctx
        per_epoch = ctx.plan.iterations_per_epoch
        iteration_level = logging.DEBUG if reporter.console else logging.INFO
        weights = ctx.layout.weights_vector(ctx.model)
        while True:
            epoch, step = ctx.plan.epoch_and_step(ctx.iteration)
            spec = self._step_spec(epoch, step)
            t_start = time.perf_counter()
            result = self._gradients(spec, weights)
            t_update = time.perf_counter()
            loss = float(math.fsum(r.loss for r in result.reports))
            lr = float(ctx.optimizer.param_groups[0]["lr"])
            self._stop_if_not_finite(loss, result.vector)
            self._apply(result.vector)
            epoch_finished = step == per_epoch - 1
            if ctx.lr_scheduler is not None and (ctx.settings.lr_scheduler_step == "iteration"
                                                 or epoch_finished):
                ctx.lr_scheduler.step()
            weights = ctx.layout.weights_vector(ctx.model)
            update_s = time.perf_counter() - t_update
            ctx.iteration += 1
            state = TrainingState(ctx.iteration, epoch + int(epoch_finished), epoch_finished)
            record = self._record(result, epoch, spec.batch_size, loss, lr, update_s,
                                  time.perf_counter() - t_start)
            log.log(iteration_level,
                    "epoch %d iteration %d (%d/%d): records %d, loss %.6g, %.0f samples/s",
                    epoch + 1, ctx.iteration, step + 1, per_epoch, spec.batch_size, loss,
                    record.samples_per_s)
            reporter.iteration(record)
            if ctx.validation is not None and ctx.validation.trigger(state):
                reporter.validation(ctx.validation.run(ctx, weights, state))
            if ctx.checkpoints is not None and ctx.checkpoints.setup.trigger(state):
                ctx.checkpoints.write(ctx)
            if ctx.end_trigger(state):
                log.info("training finished after %d iterations (%d epochs): loss %.6g",
                         ctx.iteration, state.epoch, loss)
                return

    def _record(self, result: AllReduceResult, epoch: int, records: int, loss: float,
                lr: float, update_s: float, wall: float) -> IterationRecord:
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
            **spans)
        self.ctx.summary.iterations.append(record)
        return record

    def _stop_if_not_finite(self, loss: float, vector: np.ndarray) -> None:
        """The NaN policy: stop with the last good weights (and a checkpoint of them)."""
        ctx = self.ctx
        params = vector[:ctx.layout.num_param_values]
        if math.isfinite(loss) and np.isfinite(params).all():
            return
        what = (f"the loss is {loss}" if not math.isfinite(loss) else
                f"the gradient has {int((~np.isfinite(params)).sum())} non-finite values")
        path = ctx.checkpoints.write(ctx) if ctx.checkpoints is not None else None
        good = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
        message = (f"Training stopped at iteration {ctx.iteration + 1}: {what}. The model keeps "
                   f"the last good weights (after iteration {ctx.iteration}); they are in this "
                   "error's state_dict" + (f" and in checkpoint {path}" if path else "") +
                   ". Lower the learning rate, clip gradients or check the data.")
        log.error("%s", message)
        raise NonFiniteError(message, ctx.iteration + 1, good, path)

    def _apply(self, vector: np.ndarray) -> None:
        ctx = self.ctx
        ctx.layout.set_grads(ctx.model, vector)
        ctx.layout.load_buffers(ctx.model, vector)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
