"""What every fit does around its training, whatever the strategy that trains it (driver side).

A strategy (:mod:`sparkdl.engine.strategies`) decides how a fit meets the data and produces its
iterations (a data-parallel step, a hopped sub-epoch). Around each of them the fit's own rules
run, the same code under every strategy:

* :meth:`FitLifecycle.start`: a resumed run whose end trigger had already fired trains nothing
  (its best weights restored); else the progress reporting starts;
* :meth:`FitLifecycle.record`: the iteration's record into the summary and the reports;
* :meth:`FitLifecycle.finish_iteration`: validation when its trigger fires, a metric
  scheduler's step, the end trigger, the weights an early stop may restore, checkpoints;
* :func:`stop_not_finite`: the NaN policy (the last good weights, checkpointed, in the error).

Example::

    life = FitLifecycle(ctx)
    if life.start():
        ...                                   # the strategy's iteration, then:
        ended = life.finish_iteration(state, epoch, loss, weights, metric_step)
    life.close()
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Sequence

import numpy as np

from ...errors import NonFiniteError
from ...triggers import EarlyStopping, TrainingState, planned_iterations
from .optim.optimizer_sequence import scheduler_needs_metric
from .reports.progress import ProgressReporter
from .reports.summary import IterationRecord
from .resume.checkpointing import held_state, load_held_state
from .run_context import RunContext

__all__ = ["FitLifecycle", "stop_not_finite"]

log = logging.getLogger("sparkdl")


def stop_not_finite(ctx: RunContext, what: str, unit: str = "iteration") -> None:
    """The NaN policy: stop with the last good weights (the model's now, also checkpointed when
    the run checkpoints) in a :class:`NonFiniteError`; ``what`` was not finite in ``unit``
    ``ctx.iteration + 1``."""
    path = ctx.checkpoints.write(ctx) if ctx.checkpoints is not None else None
    good = held_state(ctx.model)
    message = (f"Training stopped at {unit} {ctx.iteration + 1}: {what}. The model keeps the "
               f"last good weights (after {unit} {ctx.iteration}); they are in this error's "
               "state_dict" + (f" and in checkpoint {path}" if path else "") +
               ". Lower the learning rate, clip gradients or check the data.")
    log.error("%s", message)
    raise NonFiniteError(message, ctx.iteration + 1, good, path)


class FitLifecycle:
    """One fit's rules around its iterations (see the module docstring)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.metrics: dict[str, float] = (dict(ctx.summary.validations[-1].metrics)
                                          if ctx.summary.validations else {})
        """The latest validation's metrics (empty before the first)."""
        self.metric_scheduler = scheduler_needs_metric(ctx.lr_scheduler)
        """Whether the scheduler steps on a metric (``ReduceLROnPlateau``)."""
        self.reporter: ProgressReporter | None = None
        """The run's progress sinks, between :meth:`start` and :meth:`close`."""

    def start(self) -> bool:
        """Before the first iteration: False when the end trigger had already fired (a resumed
        run that had ended), else the progress reporting starts."""
        ctx = self.ctx
        per_epoch = ctx.plan.iterations_per_epoch
        if ctx.validation is not None:
            ctx.validation.warn_about_threshold(ctx)
        if ctx.iteration > 0:
            last = ctx.summary.iterations[-1].loss if ctx.summary.iterations else None
            state = TrainingState(ctx.iteration, ctx.iteration // per_epoch,
                                  ctx.iteration % per_epoch == 0, last, dict(self.metrics))
            if ctx.end_trigger(state):
                self.restore_best()
                log.info("the end trigger had already fired at iteration %d: nothing to train",
                         ctx.iteration)
                return False
        self.reporter = ProgressReporter(ctx.settings.progress_bar,
                                         ctx.settings.tensorboard_dir, per_epoch,
                                         planned_iterations(ctx.end_trigger, per_epoch),
                                         ctx.iteration, listeners=ctx.listeners)
        return True

    def close(self) -> None:
        """End the progress reporting (after the last iteration or a failure)."""
        reporter, self.reporter = self.reporter, None
        if reporter is not None:
            reporter.close()

    def record(self, record: IterationRecord) -> None:
        """One iteration's record: into the summary and the progress sinks."""
        self.ctx.summary.iterations.append(record)
        assert self.reporter is not None
        self.reporter.iteration(record)

    def finish_iteration(self, state: TrainingState, epoch: int, loss: float,
                         weights: Callable[[], np.ndarray], metric_step: bool,
                         unit: str = "iterations",
                         passed: Sequence[TrainingState] = ()) -> bool:
        """After an iteration's update and record (``state``: where training stands, ``epoch``
        the 0-based epoch it belonged to): validation with ``weights()`` when its trigger
        fires, a metric scheduler's step when ``metric_step``, the end trigger, the weights an
        early stop may restore, checkpoints. True when the end trigger fired (the best
        weights are then restored). ``passed``: the states of iterations since the last call
        that the strategy could not stop at (a local round's): a trigger that fires on any of
        them fires here."""
        ctx = self.ctx
        assert self.reporter is not None

        def fires(trigger: Any) -> bool:
            # Asked in the order the iterations ran, ``state`` last: a trigger that keeps what
            # it saw (EarlyStopping's ``improved``, read by remember_best) ends on this one.
            fired = [trigger(s) for s in (*passed, state)]
            return any(fired)

        if ctx.validation is not None and fires(ctx.validation.trigger):
            validation = ctx.validation.run(ctx, weights(), state)
            self.reporter.validation(validation)
            self.metrics = dict(validation.metrics)
            state = dataclasses.replace(state, metrics=dict(self.metrics), validated=True)
        if metric_step:
            ctx.lr_scheduler.step(self._scheduler_metric(state, epoch, loss))
        ended = fires(ctx.end_trigger)
        self.remember_best(state)
        if ctx.checkpoints is not None and fires(ctx.checkpoints.setup.trigger):
            ctx.checkpoints.write(ctx)
        if ended:
            self.restore_best()
            log.info("training finished after %d %s (%d epochs): loss %.6g", ctx.iteration,
                     unit, state.epoch, loss)
        return ended

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
                self.ctx.best_states[k] = held_state(self.ctx.model)

    def restore_best(self) -> None:
        """Load the best weights of an early stop that fired with ``restore_best``."""
        for k, trigger in enumerate(self._early_stops()):
            best = self.ctx.best_states.get(k)
            if trigger.stopped and trigger.restore_best and best is not None:
                load_held_state(self.ctx.model, best)
                log.info("early stopping on %s: restored the weights of iteration %d (%s %.6g)",
                         trigger.metric, trigger.best_iteration, trigger.metric, trigger.best)

    def _early_stops(self) -> list[EarlyStopping]:
        return [t for t in self.ctx.end_trigger.walk() if isinstance(t, EarlyStopping)]
