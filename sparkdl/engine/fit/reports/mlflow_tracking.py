"""MLflow tracking of a training run (driver side; optional: ``pip install 'sparkdl-torch[mlflow]'``).

:meth:`sparkdl.DistriOptimizer.set_mlflow` (``mlflowLogging=True`` on the estimators) makes
``optimize`` log to an MLflow run: its settings as the run's parameters once; per iteration
``train/loss``, ``train/samples_per_s`` and ``train/learning_rate``; per validation
``validation/<metric>``, all with ``step`` = the iteration (the names of the TensorBoard sink);
at the end the run's summary as the artifact ``sparkdl/training_summary.json``. Everything is
logged from the driver, never from a task.

Which run: the ``run_id`` given; else a new child run of ``parent_run_id``; else the run active
in the thread that calls ``optimize``; else a new run in MLflow's current experiment. A run
sparkdl created is ended when ``optimize`` returns (``FINISHED``, or ``FAILED`` when training
raised); a run it was given is left open.

Logging never slows or stops training. The training thread only appends the values to a list;
a daemon thread creates the run, sends the values in batches (``MlflowClient.log_batch``, at
most every ``flush_interval_s`` and at the end) and uploads the summary. When the tracking
server cannot be reached or a request fails, one warning says why and training goes on without
MLflow; at the end ``optimize`` waits at most ``finish_timeout_s`` for the last batch (a slow
server), and the daemon thread never keeps the process from exiting.

Example::

    import mlflow
    mlflow.set_tracking_uri("sqlite:///mlflow.db")
    with mlflow.start_run():
        opt.set_mlflow().optimize()       # logs into the active run
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping
from urllib.parse import urlparse

from ....errors import InvalidArgumentError
from .summary import IterationRecord, TrainingSummary, ValidationRecord
from ..optim.optimizer_sequence import OptimizerSequence, SchedulerSequence
from ..optim.outer_optimizer import describe_outer

__all__ = ["MlflowSetup", "MlflowTracker", "check_mlflow", "active_run_id", "engine_params",
           "FLUSH_INTERVAL_S", "FINISH_TIMEOUT_S", "MAX_PENDING", "SUMMARY_ARTIFACT"]

log = logging.getLogger("sparkdl")

FLUSH_INTERVAL_S = 5.0
"""Default seconds between two batches sent to the tracking server."""

FINISH_TIMEOUT_S = 20.0
"""Default seconds ``optimize`` waits at its end for the last batch and the summary."""

MAX_PENDING = 100_000
"""Metric values held while the server is slow; beyond it the oldest are dropped."""

SUMMARY_ARTIFACT = "sparkdl/training_summary.json"
"""Where the run's summary lands among the run's artifacts."""

CONNECT_TIMEOUT_S = 5.0
"""How long the first connection to an ``http(s)://`` tracking server may take."""

_BATCH_METRICS = 1000     # MLflow's limits per log_batch call
_BATCH_PARAMS = 100
_PARAM_CHARS = 6000


def check_mlflow(owner: str) -> Any:
    """The ``mlflow`` module, or a clear error when MLflow is not installed."""
    try:
        import mlflow
    except ImportError as exc:
        raise InvalidArgumentError(
            f"{owner} logs to MLflow, which is not installed: pip install 'sparkdl-torch[mlflow]' "
            "(or mlflow).") from exc
    return mlflow


def active_run_id() -> str | None:
    """The id of the MLflow run active in the calling thread (MLflow keeps one per thread),
    or None; never imports MLflow (no run can be active before it is imported)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or not hasattr(mlflow, "active_run"):
        return None
    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= _PARAM_CHARS else text[:_PARAM_CHARS - 3] + "..."


@dataclass(frozen=True)
class MlflowSetup:
    """What :meth:`sparkdl.DistriOptimizer.set_mlflow` asked for (validated there)."""

    run_id: str | None = None
    parent_run_id: str | None = None
    run_name: str | None = None
    params: Mapping[str, Any] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    flush_interval_s: float = FLUSH_INTERVAL_S
    finish_timeout_s: float = FINISH_TIMEOUT_S


def engine_params(engine: Any, plan: Any) -> dict[str, Any]:
    """A :class:`~sparkdl.DistriOptimizer`'s settings as MLflow parameters."""
    s = engine.settings
    o = s.runner_options
    params: dict[str, Any] = {
        "batch_size": s.batch_size, "seed": s.seed, "shuffle": s.shuffle,
        "micro_batch_size": s.micro_batch_size, "lr_scheduler_step": s.lr_scheduler_step,
        "allreduce": o.allreduce, "num_blocks": o.num_blocks, "compression": o.compression,
        "device": o.device, "precision": o.precision, "sample_weights": s.sample_weights,
        "end_trigger": repr(engine.end_trigger), "model": type(engine.model).__name__,
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "criterion": type(engine.criterion).__name__ if engine.criterion is not None else None,
        "training_step": _name(engine.training_step),
        "optimizer": (repr(engine.optimizer) if isinstance(engine.optimizer, OptimizerSequence)
                      else type(engine.optimizer).__name__),
        "lr_scheduler": ((repr(engine.lr_scheduler)
                          if isinstance(engine.lr_scheduler, SchedulerSequence)
                          else type(engine.lr_scheduler).__name__) if engine.lr_scheduler
                         else None),
        "partitions": plan.num_partitions, "samples": plan.num_samples,
        "iterations_per_epoch": plan.iterations_per_epoch}
    rounds = getattr(plan, "rounds", None)      # local rounds (their plan carries them)
    if rounds is not None:
        params.update({"local_steps": rounds.local_steps,
                       "outer_optimizer": describe_outer(rounds.outer),
                       "sync_warmup": rounds.warmup})
    for key, value in engine.optimizer.defaults.items():
        if value is None or isinstance(value, (bool, int, float, str, tuple)):
            params[f"optimizer.{key}"] = value
    return params


def _name(function: Any) -> str | None:
    """A function's qualified name (or its class's), None for None."""
    if function is None:
        return None
    return getattr(function, "__qualname__", type(function).__name__)


def _unreachable(uri: str) -> str | None:
    """Why an ``http(s)://`` tracking server cannot be reached (None when it can, or for any
    other kind of store): one TCP connection with a short timeout, so that a server that is
    down costs seconds, not MLflow's minutes of HTTP retries."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _summary_json(summary: TrainingSummary, status: str) -> str:
    last = summary.iterations[-1] if summary.iterations else None
    return json.dumps({
        "status": status,
        "iterations": last.iteration if last else 0,
        "epochs_started": last.epoch + 1 if last else 0,
        "final_loss": last.loss if last else None,
        "samples": sum(r.records for r in summary.iterations),
        "wall_s": sum(r.wall_s for r in summary.iterations),
        "validations": [asdict(v) for v in summary.validations],
        "shards_rebuilt": summary.shards_rebuilt,
        "placement_misses": summary.placement_misses,
        "replicas_built": summary.replicas_built,
        "executors_avoided": summary.executors_avoided,
        "shard_bytes": summary.shard_bytes,
        "last_iteration": asdict(last) if last else None,
    }, indent=2)


class MlflowTracker:
    """Logs one ``optimize`` call to MLflow from a daemon thread (see the module's docstring).

    The loop's :class:`~sparkdl.engine.fit.reports.progress.ProgressReporter` calls
    :meth:`iteration` and
    :meth:`validation` (cheap: the values are appended to a list); ``optimize`` calls
    :meth:`finish` once. ``run_id`` is the run logged to, once the thread has found or created
    it (None before, or when MLflow could not be reached).

    Example::

        tracker = MlflowTracker(MlflowSetup(), {"batch_size": 64}, "sqlite:///mlflow.db", None)
        tracker.start(); tracker.iteration(record); tracker.finish(summary, None)
    """

    def __init__(self, setup: MlflowSetup, params: Mapping[str, Any], tracking_uri: str,
                 current_run_id: str | None) -> None:
        self.setup = setup
        self.params = {k: _param_value(v) for k, v in params.items()}
        self.tracking_uri = tracking_uri
        self.run_id: str | None = setup.run_id or (None if setup.parent_run_id else
                                                   current_run_id)
        self.owns_run = self.run_id is None
        self._pending: list[tuple[str, float, int, int]] = []
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._failed = False
        self._sent = 0
        self._dropped = 0
        self._status = "FINISHED"
        self._summary: TrainingSummary | None = None
        self._thread = threading.Thread(target=self._work, name="sparkdl-mlflow", daemon=True)

    # ---------------------------------------------------------------- the training thread
    def start(self) -> None:
        self._thread.start()

    def _add(self, values: list[tuple[str, float]], step: int) -> None:
        if self._failed:
            return
        stamp = int(time.time() * 1000)
        with self._lock:
            self._pending.extend((key, float(value), stamp, step) for key, value in values)
            if len(self._pending) > MAX_PENDING:
                extra = len(self._pending) - MAX_PENDING
                del self._pending[:extra]
                self._dropped += extra

    def iteration(self, record: IterationRecord) -> None:
        self._add([("train/loss", record.loss), ("train/samples_per_s", record.samples_per_s),
                   ("train/learning_rate", record.learning_rate)], record.iteration)

    def validation(self, record: ValidationRecord) -> None:
        self._add([(f"validation/{name}", value) for name, value in record.metrics.items()],
                  record.iteration)

    def close(self) -> None:
        """Nothing: the run outlives the progress reporter; :meth:`finish` ends it."""

    def finish(self, summary: TrainingSummary, error: BaseException | None) -> None:
        """Send what is left and the summary, end a run sparkdl created; wait at most
        ``finish_timeout_s``."""
        self._summary = summary
        if error is not None:
            self._status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self._finished.set()
        self._thread.join(self.setup.finish_timeout_s)
        if self._thread.is_alive():
            log.warning("MLflow: the tracking server at %s did not take the last metrics and "
                        "the summary within %.0f s; they are sent in the background while this "
                        "process runs.", self.tracking_uri, self.setup.finish_timeout_s)
        elif self._dropped and not self._failed:
            log.warning("MLflow: %d metric values were dropped while the tracking server was "
                        "slow (at most %d are held).", self._dropped, MAX_PENDING)

    # ---------------------------------------------------------------- the logging thread
    def _work(self) -> None:
        try:
            reason = _unreachable(self.tracking_uri)
            if reason is not None:
                raise ConnectionError(f"cannot connect ({reason})")
            from mlflow import MlflowClient

            client = MlflowClient(self.tracking_uri)
            run_id = self._open_run(client)
            self._log_params(client, run_id)
            while True:
                done = self._finished.wait(self.setup.flush_interval_s)
                self._flush(client, run_id)
                if done:
                    break
            self._end_run(client, run_id)
        except Exception as exc:  # noqa: BLE001 - logging must never fail training
            self._fail(exc)

    def _open_run(self, client: Any) -> str:
        if self.run_id is not None:
            client.get_run(self.run_id)             # exists, and the store answers
            return self.run_id
        tags = dict(self.setup.tags)
        if self.setup.parent_run_id:
            experiment = client.get_run(self.setup.parent_run_id).info.experiment_id
            tags["mlflow.parentRunId"] = self.setup.parent_run_id
        else:
            from mlflow.tracking.fluent import _get_experiment_id

            experiment = _get_experiment_id() or "0"
        run = client.create_run(experiment, tags=tags, run_name=self.setup.run_name)
        self.run_id = run.info.run_id
        return self.run_id

    def _log_params(self, client: Any, run_id: str) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException

        items = sorted(self.params.items())
        try:
            for i in range(0, len(items), _BATCH_PARAMS):
                client.log_batch(run_id, params=[Param(k, v)
                                                 for k, v in items[i:i + _BATCH_PARAMS]])
            if not self.owns_run and self.setup.tags:
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in self.setup.tags.items()])
        except MlflowException as exc:   # e.g. the run already has a param of another value
            log.warning("MLflow: the parameters were not logged to run %s (%s); metrics still "
                        "are.", run_id, str(exc).splitlines()[0])

    def _flush(self, client: Any, run_id: str) -> None:
        from mlflow.entities import Metric

        with self._lock:
            pending, self._pending = self._pending, []
        for i in range(0, len(pending), _BATCH_METRICS):
            client.log_batch(run_id, metrics=[Metric(*v) for v in pending[i:i + _BATCH_METRICS]])
            self._sent += len(pending[i:i + _BATCH_METRICS])

    def _end_run(self, client: Any, run_id: str) -> None:
        if self._summary is not None:
            client.log_text(run_id, _summary_json(self._summary, self._status), SUMMARY_ARTIFACT)
        if self.owns_run:
            client.set_terminated(run_id, self._status)

    def _fail(self, exc: Exception) -> None:
        self._failed = True
        with self._lock:
            self._pending = []
        done = (f"{self._sent} metric values had been logged to run {self.run_id}" if self._sent
                else "nothing was logged to MLflow")
        log.warning("MLflow logging stopped: the tracking store at %s failed: %s: %s; %s. "
                    "Training goes on without MLflow.", self.tracking_uri, type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "", done)
