"""``DistriOptimizer``: synchronous data-parallel SGD over an RDD, BigDL style.

One iteration is one Spark job:

1. the driver broadcasts the current weights (one flat vector);
2. each task takes its partition's share of the global batch from the shard cached on its
   executor, loads the weights into the model replica kept in its Python worker and computes
   ``(|B_i| / |B|) * grad of the mean loss on B_i`` (plus its buffers, weighted the same way);
3. the AllReduce sums those vectors over partitions in partition order (a shuffle in which block
   ``k`` of every task meets in reduce partition ``k``), and the driver collects the sum;
4. the driver puts the sum into ``p.grad`` and calls the user's own ``optimizer.step()`` (and
   ``lr_scheduler.step()``), exactly as single-process PyTorch would on the union batch.

Model buffers (BatchNorm running statistics) are not gradients. The rule: every task runs its
forward passes in training mode starting from the broadcast buffers, and after the iteration the
model's buffers become the sample-weighted average of the tasks' buffers (integer buffers such as
``num_batches_tracked`` rounded). With one partition this is exactly single-process training;
BatchNorm's batch statistics are per task (per micro-batch), as in PyTorch DDP without SyncBN.

Randomness: batches come from :class:`~sparkdl.batching.BatchPlan`; random layers (dropout) in
task ``i`` of iteration ``t`` draw from torch's generator seeded with
``task_seed(seed, t, i)``. So the run's ``seed`` fixes every random choice.
"""

from __future__ import annotations

import logging
import math
import pickle
from dataclasses import asdict
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from pyspark import RDD
from torch import nn

from .allreduce import AllReduceResult, DriverAllReduce, ShuffleAllReduce, choose_allreduce
from .batching import BatchPlan
from .cached_data import CachedData, clean_workers, lost_data_reason
from .checkpoint import FORMAT_VERSION, CheckpointStore
from .errors import CheckpointError, NonFiniteError, SparkdlError
from .flat_params import ParamLayout
from .input_checks import (argument_error, check_criterion, check_optimizer, check_positive_int,
                           check_rdd, check_type, dry_run, summarize)
from .local_step import StepSpec, TaskReport, local_evaluation, local_gradient
from .metrics import ValidationMetric
from .process_memory import current_rss_bytes
from .progress import ProgressReporter, check_tensorboard
from .replica import ReplicaSpec
from .summary import IterationRecord, TrainingSummary, ValidationRecord
from .triggers import MaxEpoch, MaxIteration, TrainingState, Trigger
from .wire_codec import COMPRESSIONS, make_codec

__all__ = ["DistriOptimizer"]

log = logging.getLogger("sparkdl")

_OWNER = "DistriOptimizer"
_MAX_REBUILDS_PER_ITERATION = 3


def _replica_getter(run_key: str, spec_broadcast: Any) -> Callable[[], Any]:
    def get() -> Any:
        from sparkdl.replica import get_replica

        return get_replica(run_key, _Unpickling(spec_broadcast))

    return get


class _Unpickling:
    """Lets :func:`get_replica` read a broadcast of cloudpickled bytes as if it held the spec."""

    def __init__(self, broadcast: Any) -> None:
        self.broadcast = broadcast

    @property
    def value(self) -> Any:
        return pickle.loads(self.broadcast.value)


def _gradient_fn(step: StepSpec, spec_bc: Any, weights_bc: Any) -> Callable[[int, Any],
                                                                              Any]:
    getter = _replica_getter(step.run_key, spec_bc)

    def fn(partition: int, summary: Any) -> Any:
        return local_gradient(step, partition, getter, weights_bc.value)

    return fn


def _evaluation_fn(run_key: str, data_key: str, spec_bc: Any, weights_bc: Any,
                   metrics: Sequence[ValidationMetric], batch_size: int) -> Any:
    getter = _replica_getter(run_key, spec_bc)

    def fn(partition: int, records: Any) -> Any:
        for _ in records:
            pass
        sums, count = local_evaluation(data_key, partition, getter(), weights_bc.value,
                                       metrics, batch_size)
        yield partition, sums, count

    return fn


@dataclass
class _Validation:
    rdd: RDD
    trigger: Trigger
    metrics: list[ValidationMetric]
    batch_size: int


@dataclass
class _Checkpointing:
    path: str
    trigger: Trigger
    keep_last: int
    resume: bool


class DistriOptimizer:
    """Train a PyTorch model with synchronous data-parallel mini-batch SGD on a Spark RDD.

    The result equals single-process PyTorch trained on the same global batches (see
    :class:`sparkdl.batching.BatchPlan` for how batches are drawn), up to float rounding, and
    two runs with the same seed and partitioning give bitwise-identical weights.

    Args:
        model: the ``nn.Module`` to train; it is trained in place and returned by :meth:`optimize`.
        training_rdd: RDD of ``(features, label)``; features a numpy array (or a tuple of arrays
            for a multi-input model), label a scalar or an array. Floating values are stored in
            the model's parameter dtype, integers as int64.
        criterion: a loss with reduction ``'mean'`` (the default of torch's losses) or ``'sum'``.
        optimizer: a ``torch.optim.Optimizer`` built over ``model.parameters()``.
        batch_size: the global mini-batch size (any positive int).
        end_trigger: when to stop; default ``MaxEpoch(1)``.
        seed: fixes every random choice (the per-partition shuffles).
        lr_scheduler: any torch LR scheduler over ``optimizer``.
        lr_scheduler_step: ``"epoch"`` (default) steps the scheduler after each epoch,
            ``"iteration"`` after each iteration.
        micro_batch_size: accumulate each task's gradient over micro-batches of this size
            (bounds a task's memory; same result).
        shuffle: reshuffle each partition every epoch (default) or visit it in stored order.
        allreduce: ``"auto"`` (default) picks ``"driver"`` for small models and ``"shuffle"``
            otherwise (see :func:`choose_allreduce`); ``"shuffle"``: block-sharded through a
            Spark shuffle (BigDL's design); ``"driver"``: tasks return whole gradients and the
            driver sums them (one stage). All give bitwise the same result.
        compression: ``None`` (default, exact) or ``"bf16"``: gradients travel rounded to
            bfloat16 (half the bytes; sums still formed in full precision; buffers exact).
        num_blocks: number of gradient blocks / reduce partitions of the shuffle; default the
            number of partitions of ``training_rdd``.

    Example::

        from sparkdl import DistriOptimizer
        from sparkdl.triggers import MaxEpoch
        net = torch.nn.Sequential(torch.nn.Linear(4, 3))
        rdd = sc.parallelize([(np.random.rand(4).astype("float32"), i % 3) for i in range(600)], 2)
        opt = DistriOptimizer(model=net, training_rdd=rdd, criterion=torch.nn.CrossEntropyLoss(),
                              optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                              batch_size=64, end_trigger=MaxEpoch(5), seed=0)
        trained = opt.optimize()
        opt.summary.to_pandas()
    """

    def __init__(self, model: nn.Module, training_rdd: RDD, criterion: Any,
                 optimizer: torch.optim.Optimizer, batch_size: int,
                 end_trigger: Trigger | None = None, seed: int = 0,
                 lr_scheduler: Any = None, lr_scheduler_step: str = "epoch",
                 micro_batch_size: int | None = None, shuffle: bool = True,
                 allreduce: str = "auto", num_blocks: int | None = None,
                 progress_bar: bool | None = None, compression: str | None = None) -> None:
        self.model = check_type("model", _OWNER, model, nn.Module, "a torch.nn.Module")
        self.training_rdd = check_rdd("training_rdd", _OWNER, training_rdd)
        self.reduction = check_criterion(_OWNER, criterion)
        self.criterion = criterion
        check_optimizer(_OWNER, optimizer, model)
        self.optimizer = optimizer
        self.batch_size = check_positive_int("batch_size", _OWNER, batch_size)
        self.end_trigger = check_type("end_trigger", _OWNER,
                                      end_trigger if end_trigger is not None else MaxEpoch(1),
                                      Trigger, "a sparkdl.triggers.Trigger such as MaxEpoch(5)")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise argument_error("seed", _OWNER, "an int", seed)
        self.seed = int(seed)
        if lr_scheduler is not None and getattr(lr_scheduler, "optimizer", None) is not optimizer:
            raise argument_error("lr_scheduler", _OWNER,
                                 "a torch LR scheduler built over the given optimizer",
                                 lr_scheduler)
        self.lr_scheduler = lr_scheduler
        if lr_scheduler_step not in ("epoch", "iteration"):
            raise argument_error("lr_scheduler_step", _OWNER, "'epoch' or 'iteration'",
                                 lr_scheduler_step)
        self.lr_scheduler_step = lr_scheduler_step
        self.micro_batch_size = check_positive_int("micro_batch_size", _OWNER, micro_batch_size,
                                                   allow_none=True)
        self.shuffle = check_type("shuffle", _OWNER, shuffle, bool, "a bool")
        if allreduce not in ("auto", "shuffle", "driver"):
            raise argument_error("allreduce", _OWNER, "'auto', 'shuffle' or 'driver'", allreduce)
        self.allreduce = allreduce
        if compression not in COMPRESSIONS:
            raise argument_error("compression", _OWNER, "None or 'bf16'", compression)
        self.compression = compression
        self.num_blocks = check_positive_int("num_blocks", _OWNER, num_blocks, allow_none=True)
        if progress_bar is not None and not isinstance(progress_bar, bool):
            raise argument_error("progress_bar", _OWNER, "True, False or None (automatic)",
                                 progress_bar)
        self.progress_bar = progress_bar
        self._tensorboard_dir: str | None = None
        self.layout = ParamLayout(model)
        self._validation: _Validation | None = None
        self._checkpointing: _Checkpointing | None = None
        self.summary = TrainingSummary()
        self.iteration = 0
        self.data_spec: Any = None

    def set_validation(self, rdd: RDD, trigger: Trigger,
                       metrics: Sequence[ValidationMetric],
                       batch_size: int = 1024) -> "DistriOptimizer":
        """Evaluate ``metrics`` on ``rdd`` whenever ``trigger`` fires (results in the summary
        and the log).

        Example: ``opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy(), Loss()])``.
        """
        owner = f"{_OWNER}.set_validation"
        check_rdd("rdd", owner, rdd)
        check_type("trigger", owner, trigger, Trigger, "a sparkdl.triggers.Trigger")
        if isinstance(metrics, ValidationMetric):
            metrics = [metrics]
        if not metrics or not all(isinstance(m, ValidationMetric) for m in metrics):
            raise argument_error("metrics", owner, "a non-empty list of "
                                 "sparkdl.metrics.ValidationMetric", metrics)
        self._validation = _Validation(rdd, trigger, list(metrics),
                                       check_positive_int("batch_size", owner, batch_size))
        return self

    def set_checkpoint(self, path: str, trigger: Trigger, keep_last: int = 3,
                       resume: bool = True) -> "DistriOptimizer":
        """Write the whole training state to ``path`` whenever ``trigger`` fires.

        A checkpoint holds the model, optimizer and scheduler states, the iteration and epoch,
        torch's RNG state and the summary so far; it is written atomically (temporary file, then
        rename) through Spark's Hadoop FileSystem (``hdfs://``, ``s3a://``, ``file://`` or a plain
        path). Only the newest ``keep_last`` are kept. With ``resume=True`` (the default),
        :meth:`optimize` continues from the newest checkpoint already in ``path``, to the same
        result as an uninterrupted run; with ``resume=False`` the directory must hold none.
        The directory is checked for writing now, before any cluster work.

        Example: ``opt.set_checkpoint("hdfs:///ckpt/run1", EveryEpoch(), keep_last=2)``.
        """
        owner = f"{_OWNER}.set_checkpoint"
        if not isinstance(path, str) or not path.strip():
            raise argument_error("path", owner, "a non-empty directory path or URI", path)
        check_type("trigger", owner, trigger, Trigger,
                   "a sparkdl.triggers.Trigger such as EveryEpoch()")
        keep_last = check_positive_int("keep_last", owner, keep_last)
        check_type("resume", owner, resume, bool, "a bool")
        store = CheckpointStore(path, self.training_rdd.context)
        store.check_writable()
        if not resume and store.iterations():
            raise CheckpointError(
                f"The checkpoint directory {path!r} already holds checkpoints "
                f"(iterations {store.iterations()}) and resume=False: choose an empty directory "
                "or pass resume=True to continue from the newest one.")
        self._checkpointing = _Checkpointing(path, trigger, keep_last, resume)
        return self

    def set_tensorboard(self, log_dir: str) -> "DistriOptimizer":
        """Also write training scalars (loss, learning rate, samples/s per iteration) and
        validation metrics as TensorBoard summaries under ``log_dir`` (a local directory on the
        driver). Needs the ``tensorboard`` package; checked now.

        Example: ``opt.set_tensorboard("/tmp/tb/run1")``, then ``tensorboard --logdir /tmp/tb``.
        """
        owner = f"{_OWNER}.set_tensorboard"
        if not isinstance(log_dir, str) or not log_dir.strip():
            raise argument_error("log_dir", owner, "a non-empty directory path", log_dir)
        check_tensorboard(log_dir)
        self._tensorboard_dir = log_dir
        return self

    # ----------------------------------------------------------------------------- training
    def optimize(self) -> nn.Module:
        """Train until the end trigger fires; return the trained model (the same object)."""
        sc = self.training_rdd.context
        run_key = f"run-{uuid.uuid4().hex[:12]}"
        dtype = self.layout.numpy_dtype.str
        train = CachedData(self.training_rdd, dtype, "training")
        val = CachedData(self._validation.rdd, dtype, "validation") if self._validation else None
        spec_bc = None
        store = (CheckpointStore(self._checkpointing.path, sc)
                 if self._checkpointing is not None else None)
        resumed = self._read_latest_checkpoint(store)
        try:
            spec = summarize(train.build(), "training")
            self.data_spec = spec
            dry_run(self.model, self.criterion, spec, "training")
            if val is not None:
                val_spec = summarize(val.build(), "validation")
                dry_run(self.model, self.criterion, val_spec, "validation")
            plan = BatchPlan(spec.partition_sizes, self.batch_size, self.seed, self.shuffle)
            if resumed is not None:
                self._restore(resumed, plan, store)
            spec_bc = sc.broadcast(self._replica_bytes())
            allreduce = self._make_allreduce(train.num_partitions)
            log.info("training on %d samples in %d partitions: global batch %d, %d iterations "
                     "per epoch, %s all-reduce of %d values%s", plan.num_samples,
                     plan.num_partitions, self.batch_size, plan.iterations_per_epoch,
                     type(allreduce).__name__, self.layout.size,
                     " (gradients in bf16)" if self.compression else "")
            self._loop(sc, run_key, train, val, plan, spec_bc, allreduce, store)
        finally:
            if spec_bc is not None:
                spec_bc.destroy(blocking=False)
            train.release()
            keys = [run_key, train.data_key]
            if val is not None:
                val.release()
                keys.append(val.data_key)
            clean_workers(sc, keys)
        return self.model

    # --------------------------------------------------------------------------- checkpoints
    def _model_signature(self) -> list[list[Any]]:
        return [[name, list(t.shape)] for name, t in self.model.state_dict().items()]

    def _read_latest_checkpoint(self, store: CheckpointStore | None) -> dict[str, Any] | None:
        """The newest checkpoint to resume from, checked against this model (no cluster work)."""
        if store is None or self._checkpointing is None or not self._checkpointing.resume:
            return None
        iterations = store.iterations()
        if not iterations:
            return None
        state = store.read(iterations[-1])
        name = store.file_name(iterations[-1])
        model_class = f"{type(self.model).__module__}.{type(self.model).__qualname__}"
        if state.get("model_class") != model_class:
            raise CheckpointError(f"The checkpoint {name} is of a model of class "
                                  f"{state.get('model_class')}, not {model_class}.")
        theirs = state.get("model_signature", [])
        ours = self._model_signature()
        if theirs != ours:
            diff = next(((a, b) for a, b in zip(theirs, ours) if a != b),
                        (theirs[len(ours):len(ours) + 1] or ["(none)"],
                         ours[len(theirs):len(theirs) + 1] or ["(none)"]))
            raise CheckpointError(f"The checkpoint {name} belongs to a different model: it has "
                                  f"{diff[0]} where this model has {diff[1]}.")
        return state

    def _run_settings(self, plan: BatchPlan) -> dict[str, Any]:
        """What a resumed run must share with the checkpointed one to reproduce it bitwise."""
        return {"seed": self.seed, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "partition_sizes": [int(n) for n in plan.partition_sizes]}

    def _restore(self, state: dict[str, Any], plan: BatchPlan,
                 store: CheckpointStore | None) -> None:
        assert store is not None
        name = store.file_name(int(state["iteration"]))
        for key, value in self._run_settings(plan).items():
            if state["run"].get(key) != value:
                raise CheckpointError(
                    f"The checkpoint {name} was written by a run with {key}="
                    f"{state['run'].get(key)}, but this run has {key}={value}: resuming would not "
                    "reproduce the interrupted run. Use the same data partitioning and settings, "
                    "or a new checkpoint directory.")
        self.model.load_state_dict(state["model_state"])
        self.optimizer.load_state_dict(state["optimizer_state"])
        if self.lr_scheduler is not None and state.get("scheduler_state") is not None:
            self.lr_scheduler.load_state_dict(state["scheduler_state"])
        torch.set_rng_state(state["torch_rng_state"])
        self.iteration = int(state["iteration"])
        self.summary = TrainingSummary(
            [IterationRecord(**r) for r in state["summary"]["iterations"]],
            [ValidationRecord(**v) for v in state["summary"]["validations"]])
        log.warning("resuming from checkpoint %s: iteration %d, epoch %d", name, self.iteration,
                    self.iteration // plan.iterations_per_epoch)

    def _checkpoint_state(self, plan: BatchPlan) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "model_class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
            "model_signature": self._model_signature(),
            "model_state": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer_state": self.optimizer.state_dict(),
            "scheduler_state": (self.lr_scheduler.state_dict()
                                if self.lr_scheduler is not None else None),
            "iteration": self.iteration,
            "epoch": self.iteration // plan.iterations_per_epoch,
            "run": self._run_settings(plan),
            "torch_rng_state": torch.get_rng_state(),
            "summary": {"iterations": [asdict(r) for r in self.summary.iterations],
                        "validations": [asdict(v) for v in self.summary.validations]},
        }

    def _write_checkpoint(self, store: CheckpointStore, plan: BatchPlan) -> str:
        assert self._checkpointing is not None
        path = store.write(self.iteration, self._checkpoint_state(plan),
                           self._checkpointing.keep_last)
        log.info("checkpoint written: %s", path)
        return path

    def _replica_bytes(self) -> bytes:
        from pyspark import cloudpickle

        return cloudpickle.dumps(ReplicaSpec(self.model, self.criterion, self.reduction))

    def _make_allreduce(self, num_partitions: int) -> Any:
        layout = self.layout
        codec = make_codec(self.compression, layout.numpy_dtype, layout.num_param_values)
        path = self.allreduce
        if path == "auto":
            path = choose_allreduce(layout.size * layout.numpy_dtype.itemsize, num_partitions)
        if path == "driver":
            return DriverAllReduce(layout.size, layout.numpy_dtype, codec)
        return ShuffleAllReduce(layout.size, layout.numpy_dtype,
                                self.num_blocks or num_partitions, codec)

    def _loop(self, sc: Any, run_key: str, train: CachedData, val: CachedData | None,
              plan: BatchPlan, spec_bc: Any, allreduce: Any,
              store: CheckpointStore | None) -> None:
        weights = self.layout.weights_vector(self.model)
        if self.iteration > 0:
            done = self.iteration % plan.iterations_per_epoch == 0
            if self.end_trigger(TrainingState(self.iteration,
                                              self.iteration // plan.iterations_per_epoch,
                                              done)):
                log.info("the end trigger had already fired at iteration %d: nothing to train",
                         self.iteration)
                return
        reporter = ProgressReporter(self.progress_bar, self._tensorboard_dir,
                                    plan.iterations_per_epoch,
                                    _total_iterations(self.end_trigger, plan), self.iteration)
        try:
            self._iterate(sc, run_key, train, val, plan, spec_bc, allreduce, store, weights,
                          reporter)
        finally:
            reporter.close()

    def _iterate(self, sc: Any, run_key: str, train: CachedData, val: CachedData | None,
                 plan: BatchPlan, spec_bc: Any, allreduce: Any, store: CheckpointStore | None,
                 weights: np.ndarray, reporter: ProgressReporter) -> None:
        iteration_level = logging.DEBUG if reporter.console else logging.INFO
        while True:
            epoch, step = plan.epoch_and_step(self.iteration)
            starts, counts = plan.shares(epoch, step)
            records = plan.batch_size_at(step)
            step_spec = StepSpec(run_key, train.data_key, self.seed, self.shuffle, self.iteration,
                                 epoch, starts, counts, records, self.micro_batch_size)
            t_start = time.perf_counter()
            weights_bc = sc.broadcast(weights)
            broadcast_s = time.perf_counter() - t_start
            try:
                result = self._reduce_with_recovery(train, allreduce, step_spec, spec_bc,
                                                    weights_bc)
            finally:
                weights_bc.destroy(blocking=False)
            t_update = time.perf_counter()
            loss = float(math.fsum(r.loss for r in result.reports))
            lr = float(self.optimizer.param_groups[0]["lr"])
            self._stop_if_not_finite(loss, result.vector, plan, store)
            self._apply(result.vector)
            epoch_finished = step == plan.iterations_per_epoch - 1
            if self.lr_scheduler is not None and (self.lr_scheduler_step == "iteration"
                                                  or epoch_finished):
                self.lr_scheduler.step()
            weights = self.layout.weights_vector(self.model)
            update_s = time.perf_counter() - t_update
            wall = time.perf_counter() - t_start
            self.iteration += 1
            state = TrainingState(self.iteration, epoch + int(epoch_finished), epoch_finished)
            compute_s = max((r.compute_s for r in result.reports), default=0.0)
            spans = result.timeline()
            record = IterationRecord(
                iteration=self.iteration, epoch=epoch + 1, records=records, loss=loss,
                learning_rate=lr, samples_per_s=records / wall, wall_s=wall,
                compute_s=compute_s, reduce_s=result.reduce_s, update_s=update_s,
                broadcast_s=broadcast_s,
                other_s=max(0.0, wall - compute_s - result.reduce_s - update_s - broadcast_s
                            - sum(spans.values())),
                driver_rss_bytes=current_rss_bytes(),
                worker_rss_bytes=max((r.rss_bytes for r in result.reports), default=0),
                **spans)
            self.summary.iterations.append(record)
            log.log(iteration_level,
                    "epoch %d iteration %d (%d/%d): records %d, loss %.6g, %.0f samples/s",
                    epoch + 1, self.iteration, step + 1, plan.iterations_per_epoch, records,
                    loss, record.samples_per_s)
            reporter.iteration(record)
            if self._validation is not None and val is not None and \
                    self._validation.trigger(state):
                reporter.validation(self._validate(sc, run_key, val, spec_bc, weights, state))
            if store is not None and self._checkpointing is not None and \
                    self._checkpointing.trigger(state):
                self._write_checkpoint(store, plan)
            if self.end_trigger(state):
                log.info("training finished after %d iterations (%d epochs): loss %.6g",
                         self.iteration, state.epoch, loss)
                return

    def _reduce_with_recovery(self, train: CachedData, allreduce: Any, step_spec: StepSpec,
                              spec_bc: Any, weights_bc: Any) -> AllReduceResult:
        """Run the iteration's job; if executor-held data was lost, rebuild it and run again."""
        for attempt in range(_MAX_REBUILDS_PER_ITERATION + 1):
            assert train.index_rdd is not None
            try:
                result = allreduce.run(train.index_rdd,
                                       _gradient_fn(step_spec, spec_bc, weights_bc))
            except Exception as exc:
                reason = lost_data_reason(exc)
                if reason is None or attempt == _MAX_REBUILDS_PER_ITERATION:
                    raise
                train.rebuild(f"the job of iteration {self.iteration + 1} lost executor-held "
                              f"data ({reason})")
                continue
            self._log_retries(result.reports)
            missing = result.missing_partitions
            if not missing and result.vector is not None:
                return result
            train.rebuild(f"partitions {missing} found no shard on the executor that ran them")
        raise SparkdlError(f"iteration {self.iteration + 1}: the training shards could not be "
                           f"kept on the executors after {_MAX_REBUILDS_PER_ITERATION} rebuilds")

    @staticmethod
    def _log_retries(reports: list[TaskReport]) -> None:
        retried = [r.partition for r in reports if r.attempt > 0]
        if retried:
            log.warning("tasks of partitions %s were retried by Spark; the result is unchanged "
                        "(tasks are deterministic)", retried)

    def _stop_if_not_finite(self, loss: float, vector: np.ndarray | None, plan: BatchPlan,
                            store: CheckpointStore | None) -> None:
        if vector is None:  # pragma: no cover - guarded by _reduce_with_recovery
            raise SparkdlError("no gradient was produced")
        params = vector[:self.layout.num_param_values]
        if math.isfinite(loss) and np.isfinite(params).all():
            return
        what = (f"the loss is {loss}" if not math.isfinite(loss) else
                f"the gradient has {int((~np.isfinite(params)).sum())} non-finite values")
        path = self._write_checkpoint(store, plan) if store is not None else None
        good = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        message = (f"Training stopped at iteration {self.iteration + 1}: {what}. The model keeps "
                   f"the last good weights (after iteration {self.iteration}); they are in this "
                   "error's state_dict" + (f" and in checkpoint {path}" if path else "") +
                   ". Lower the learning rate, clip gradients or check the data.")
        log.error("%s", message)
        raise NonFiniteError(message, self.iteration + 1, good, path)

    def _apply(self, vector: np.ndarray | None) -> None:
        if vector is None:  # pragma: no cover - guarded by _reduce_with_recovery
            raise SparkdlError("no gradient was produced")
        self.layout.set_grads(self.model, vector)
        self.layout.load_buffers(self.model, vector)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _validate(self, sc: Any, run_key: str, val: CachedData, spec_bc: Any,
                  weights: np.ndarray, state: TrainingState) -> ValidationRecord:
        assert self._validation is not None and val.index_rdd is not None
        metrics = self._validation.metrics
        weights_bc = sc.broadcast(weights)
        try:
            for _ in range(_MAX_REBUILDS_PER_ITERATION + 1):
                fn = _evaluation_fn(run_key, val.data_key, spec_bc, weights_bc, metrics,
                                    self._validation.batch_size)
                results = sorted(val.index_rdd.mapPartitionsWithIndex(fn).collect(),
                                 key=lambda r: r[0])
                missing = [p for p, sums, n in results if sums is None and
                           val.summaries[p].count > 0]
                if not missing:
                    break
                val.rebuild(f"partitions {missing} found no shard on the executor that ran them")
        finally:
            weights_bc.destroy(blocking=False)
        values: dict[str, float] = {}
        for m, metric in enumerate(metrics):
            parts = [sums[m] for _, sums, n in results if sums is not None and n > 0]
            total = np.sum(parts, axis=0) if parts else np.zeros(2)
            values[metric.name] = metric.result(total)
        record = ValidationRecord(state.iteration, state.epoch, values)
        self.summary.validations.append(record)
        log.info("validation after iteration %d (epoch %d): %s", state.iteration, state.epoch,
                 ", ".join(f"{k} {v:.6g}" for k, v in values.items()))
        return record


def _total_iterations(trigger: Trigger, plan: BatchPlan) -> int | None:
    """The run's last iteration when the end trigger says it in advance (for the ETA)."""
    if isinstance(trigger, MaxEpoch):
        return trigger.max_epoch * plan.iterations_per_epoch
    if isinstance(trigger, MaxIteration):
        return trigger.max_iteration
    return None
