"""Opening a fit on a runner, and ending it (driver side): where the fit and its strategy meet.

:func:`open_fit` does everything before a fit's first iteration: the checks, the checkpoint
directory and its resume, the data held (once per pass, through the runner's view), the dry
runs, the plan, the model shipped to the tasks, MLflow. What depends on how the fit is run it
asks its strategy, through the questions of :class:`OpeningStrategy` (its checks, its plan,
its part of the resume key, whether the model ships now, how the log names the run); the fit
never knows which strategy it is. :func:`end_fit` ends the run, whatever happened.

Example::

    run = open_fit(fit, FitView(runner, loads), strategy, position=0)
    try:
        ...                                  # the strategy drives run.ctx and run.lifecycle
    finally:
        end_fit(fit, run)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Protocol

from ...executor.replicas import ReplicaSpec
from ...runners.interface import DataHandle
from ...transport.flat_layout import ParamLayout
from .checks.data_checks import DataSpec, dry_run, summarize
from .checks.sparse_checks import check_sparse_gradients
from .checks.task_parallelism import choose_sub_replicas, prefers_sub_replicas
from .lifecycle import FitLifecycle
from .optim.loss_scaling import LossScaler
from .reports.mlflow_tracking import MlflowTracker, active_run_id, engine_params
from .reports.summary import TrainingSummary
from .resume.checkpoint_directories import exclusive_directory, note_settings
from .resume.checkpointing import Checkpoints
from .resume.fit_identity import data_digest, fit_identity, identity_directory, validation_decides
from .run_context import RunContext
from .spec import OWNER, Fit

__all__ = ["OpeningStrategy", "FitRun", "open_fit", "end_fit"]

log = logging.getLogger("sparkdl")


class OpeningStrategy(Protocol):
    """What a fit asks its strategy while it opens (a strategy,
    :class:`sparkdl.engine.strategies.base.Strategy`, answers)."""

    def check(self, fit: Fit, runner: Any) -> None:
        """Refuse, before any job, what this strategy cannot run (settings, the runner)."""

    def plan(self, fit: Fit, spec: DataSpec, position: int) -> Any:
        """The fit's plan over the held data: which samples each iteration takes where."""

    def resume_key(self, plan: Any) -> dict[str, Any]:
        """The strategy's own settings in the fit's resume key ({} for the plain one)."""

    def ships_model(self, fit: Fit) -> bool:
        """Whether the model is shipped to the tasks when the fit opens."""

    def describe(self, fit: Fit, plan: Any, how: str) -> str:
        """The log line that says how the fit trains."""


@dataclasses.dataclass
class FitRun:
    """One opened fit: its runner view, context, lifecycle, shipped model spec, checkpoint
    directories held, MLflow tracker and failure."""

    runner: Any
    ctx: RunContext | None = None
    spec: ReplicaSpec | None = None
    lifecycle: FitLifecycle | None = None
    tracker: MlflowTracker | None = None
    failure: BaseException | None = None
    held: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)
    ended: bool = False


def _load_data(fit: Fit, runner: Any, identity: dict[str, Any]) -> DataHandle:
    """The training (and validation) data held for the tasks, each tried on a few rows."""
    dtype = fit.layout.data_dtype.str
    train = runner.load(fit.training_rdd, "training", dtype, fit.sequence_inputs)
    fit.data_spec = summarize(train.summaries, "training")
    param_dtype = fit.layout.param_dtype
    steps = (fit.training_step, fit.validation_step)
    dry_run(fit.model, fit.criterion, fit.data_spec, "training", dtype=param_dtype,
            arguments=fit.model_arguments, steps=steps, prediction=fit.needs_prediction,
            names=fit.input_names, collate=fit.collate)
    if fit.validation is not None:
        fit.validation.held = runner.load(fit.validation.data, "validation", dtype,
                                          fit.sequence_inputs)
        dry_run(fit.model, fit.criterion, summarize(fit.validation.held.summaries, "validation"),
                "validation", fit.validation.metrics, param_dtype, fit.model_arguments, steps,
                names=fit.input_names, collate=fit.collate)
        if identity and validation_decides(fit):
            identity["validation"]["data"] = data_digest(fit.validation.held.summaries)
    return train


def _context(fit: Fit, runner: Any, train: DataHandle, plan: Any,
             checkpoints: Checkpoints | None) -> tuple[RunContext, str]:
    """The run's context, with the sub-replicas chosen for the runner's cores."""
    sub_replicas, cores_use = choose_sub_replicas(
        fit.sub_replicas, runner.task_cores(),
        fit.settings.runner_options.device == "cuda" or runner.schedules_gpus(),
        fit.concurrency_hazard, fit.train_transform is not None, prefers_sub_replicas(fit.model))
    settings = dataclasses.replace(fit.settings, sub_replicas=sub_replicas)
    ctx = RunContext(settings, fit.model, fit.criterion, fit.reduction, fit.optimizer,
                     fit.lr_scheduler, fit.layout, fit.end_trigger, runner, train, plan,
                     fit.validation, checkpoints, fit.clipping,
                     LossScaler() if settings.runner_options.precision == "16-mixed" else None)
    ctx.training_step = fit.training_step
    return ctx, cores_use


def open_fit(fit: Fit, runner: Any, strategy: OpeningStrategy, position: int = 0) -> FitRun:
    """Everything before ``fit``'s first iteration on ``runner`` (a
    :class:`sparkdl.runners.fit_view.FitView` of the pass's runner), as ``strategy`` runs it
    (``position``: the fit's place among the strategy's fits). Returns the run, which the
    strategy drives; :func:`end_fit` ends it, whatever happened."""
    strategy.check(fit, runner)
    fit.check_trigger_metrics()
    fit.layout = ParamLayout(fit.model)          # as the model is now (requires_grad flags)
    check_sparse_gradients(OWNER, fit.model, fit.layout, fit.optimizer, fit.clipping is not None)
    for trigger in fit.end_trigger.walk():
        trigger.reset()
    runner.check_device(fit.settings.runner_options.device)
    setup = fit.checkpoint_setup
    # only checkpoints need the identity (hashing every weight and function costs time)
    identity = fit_identity(fit) if setup is not None else {}
    checkpoints = (Checkpoints(setup, fit.checkpoint_store(setup.path))
                   if setup is not None and not setup.by_fit else None)
    run = FitRun(runner)
    if checkpoints is not None:      # this process's other fits keep out of its directory
        run.held.enter_context(exclusive_directory(setup.path))
    try:
        resumed = checkpoints.latest(fit.model) if checkpoints is not None else None
        train = _load_data(fit, runner, identity)
        assert fit.data_spec is not None
        plan = strategy.plan(fit, fit.data_spec, position)
        ctx, cores_use = _context(fit, runner, train, plan, checkpoints)
        ctx.strategy_key = strategy.resume_key(plan)
        run.ctx = ctx
        if setup is not None:
            ctx.fit_key = dict(identity, data=data_digest(train.summaries))
        if setup is not None and setup.by_fit:   # this fit's own subdirectory
            directory = f"{setup.path.rstrip('/')}/{identity_directory(ctx.resume_key())}"
            run.held.enter_context(exclusive_directory(directory))
            ctx.checkpoints = checkpoints = Checkpoints(
                dataclasses.replace(setup, path=directory), fit.checkpoint_store(directory))
            resumed = checkpoints.latest(fit.model)
            note_settings(setup.path.rstrip("/"), directory, ctx.resume_key(),
                          checkpoints.store.files, resumed is not None)
            log.info("checkpoints of this fit go to %s", directory)
        if resumed is not None:
            checkpoints.restore(ctx, resumed)  # type: ignore[union-attr]
        run.spec = ReplicaSpec(fit.model, fit.criterion, fit.reduction, fit.train_transform,
                               fit.padding_value, fit.collate, fit.settings.sample_weights,
                               fit.training_step, fit.validation_step, fit.input_names)
        how = (runner.start(run.spec, fit.layout, fit.settings.runner_options, train)
               if strategy.ships_model(fit) else "")
        log.info("%s", strategy.describe(fit, plan, how))
        log.info("tasks use their cores as %s", cores_use)
        run.tracker = _mlflow_tracker(fit, plan)
        ctx.listeners = [run.tracker] if run.tracker is not None else []
        run.lifecycle = FitLifecycle(ctx)
    except BaseException as exc:
        run.failure = exc
        end_fit(fit, run)
        raise
    return run


def _mlflow_tracker(fit: Fit, plan: Any) -> MlflowTracker | None:
    setup = fit.mlflow
    if setup is None:
        return None
    import mlflow

    params = setup.params if setup.params is not None else engine_params(fit, plan)
    tracker = MlflowTracker(setup, params, mlflow.get_tracking_uri(), active_run_id())
    tracker.start()
    return tracker


def _count_rebuilds(summary: TrainingSummary, held: list[Any]) -> None:
    """Add this run's rebuilt shards and placement misses to the summary, and say so; set the
    bytes of the shards held on the executors."""
    rebuilt = sum(h.shards_rebuilt for h in held)
    misses = sum(h.placement_misses for h in held)
    summary.shards_rebuilt += rebuilt
    summary.placement_misses += misses
    summary.replicas_built += sum(getattr(h, "replicas_built", 0) for h in held)
    summary.executors_avoided += sum(h.placement.slow.avoidances for h in held
                                     if getattr(h, "placement", None) is not None)
    summary.shard_bytes = sum(getattr(h, "held_bytes", 0) for h in held)
    if rebuilt:
        log.info("%d shards were rebuilt during the run (%d of them for tasks that ran where "
                 "their shard was not)", rebuilt, misses)


def end_fit(fit: Fit, run: FitRun) -> None:
    """After the fit's last iteration, or its failure (``run.failure``): the summary, the
    checkpoint directory released, the fit's replicas released (the pass closes its runner),
    MLflow told."""
    if run.ended:
        return
    run.ended = True
    run.held.close()
    ctx = run.ctx
    validation = fit.validation
    if ctx is not None:
        fit.summary, fit.iteration = ctx.summary, ctx.iteration
        _count_rebuilds(ctx.summary, [ctx.train] + (
            [validation.held] if validation is not None and validation.held is not None
            else []))
    if validation is not None:
        validation.held = None
    run.runner.close()
    if run.tracker is not None:
        run.tracker.finish(fit.summary, run.failure)
        fit.mlflow_run_id = run.tracker.run_id
