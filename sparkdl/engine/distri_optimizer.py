"""``DistriOptimizer``: the engine's public API (driver side).

It checks every argument when constructed (before any cluster work), records what
``set_validation`` / ``set_checkpoint`` / ``set_tensorboard`` ask for, and in :meth:`optimize`
builds one :class:`~sparkdl.engine.fit.run_context.RunContext` and hands it to the
:class:`~sparkdl.engine.strategies.sync.step.TrainingLoop`. Where the jobs run is the runner's business
(:mod:`sparkdl.runners.interface`): an RDD runs on its SparkContext
(:mod:`sparkdl.runners.spark_rdd`), :class:`sparkdl.runners.LocalPartitions` in process.

One iteration (see docs/architecture.md):

1. the driver ships the current state (parameters and buffers, raw bytes) to every task;
2. each task takes its partition's share of the global batch from the shard cached on its
   executor, loads the state into the model replica kept in its Python worker and computes
   ``(|B_i| / |B|) * grad of the mean loss on B_i`` (and reports the buffers it changed);
3. the AllReduce sums those vectors over partitions in partition order, and the driver gets the
   sum;
4. the driver puts the sum into ``p.grad`` and calls the user's own ``optimizer.step()`` (and
   ``lr_scheduler.step()``), exactly as single-process PyTorch would on the union batch.

Model buffers (BatchNorm running statistics) are not gradients. The rule: every task runs its
forward passes in training mode starting from the broadcast buffers; after the iteration a buffer
no task changed is bitwise unchanged, one every task set to the same value takes it bitwise, and
any other becomes the sample-weighted average of the tasks' values (integers such as
``num_batches_tracked`` rounded; :func:`sparkdl.transport.flat_layout.combine_buffers`). With one
partition this is exactly single-process training; BatchNorm's batch statistics are per task
(per micro-batch), as in PyTorch DDP without SyncBN.

Randomness: batches come from :class:`~sparkdl.data.batch_plan.BatchPlan`; random layers
(dropout) in task ``i`` of iteration ``t`` draw from torch's generator seeded with
``task_seed(seed, t, i)``. So the run's ``seed`` fixes every random choice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..argument_checks import (argument_error, check_choice, check_int, check_positive_int,
                               check_type)
from ..data.batch_plan import BatchPlan
from ..errors import CheckpointError, InvalidArgumentError
from ..executor.devices import DEVICES
from ..executor.replicas import ReplicaSpec
from ..metrics import ValidationMetric
from ..storage.checkpoint_store import CheckpointStore
from ..transport.codecs import COMPRESSIONS
from ..transport.flat_layout import ParamLayout
from ..triggers import MaxEpoch, Trigger
from ..training_step import TrainingStep, ValidationStep
from .fit.optim.optimizer_sequence import as_optimizer, as_scheduler
from .fit.checks.sparse_checks import check_sparse_gradients
from .fit.checks.arguments import (check_criterion, check_lr_scheduler, check_optimizer, check_steps,
                        check_training_data)
from .fit.resume.checkpoint_directories import exclusive_directory, note_settings
from .fit.resume.checkpointing import CheckpointSetup, Checkpoints
from .fit.optim.clipping import GradientClipping, check_norm_clipping, check_value_clipping
from .strategies.hop.jobs import check_hop_settings
from .strategies.hop.order import HopPlan
from .fit.resume.fit_identity import data_digest, fit_identity, identity_directory, validation_decides
from .fit.optim.loss_scaling import PRECISIONS, LossScaler
from .fit.reports.mlflow_tracking import (FINISH_TIMEOUT_S, FLUSH_INTERVAL_S, MlflowSetup, MlflowTracker,
                              active_run_id, check_mlflow, engine_params)
from .fit.checks.data_checks import DataSpec, dry_run, sample_batch, summarize
from .fit.reports.progress import check_tensorboard
from .fit.run_context import RunContext, RunSettings
from ..runners.interface import RunnerOptions
from ..data.ragged import model_arguments
from .fit.reports.summary import TrainingSummary
from .fit.checks.task_parallelism import choose_sub_replicas, concurrency_hazard, prefers_sub_replicas
from .fit.optim.optimizer_sequence import needs_closure
from .strategies.sync.step import TrainingLoop
from .fit.validation import Validation

__all__ = ["DistriOptimizer"]

log = logging.getLogger("sparkdl")


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

_OWNER = "DistriOptimizer"


class DistriOptimizer:
    """Train a PyTorch model with synchronous data-parallel mini-batch SGD on a Spark RDD.

    The result equals single-process PyTorch trained on the same global batches (see
    :class:`sparkdl.BatchPlan` for how batches are drawn), up to float rounding, and
    two runs with the same seed and partitioning give bitwise-identical weights.

    Args:
        model: the ``nn.Module`` to train; it is trained in place and returned by :meth:`optimize`.
        training_rdd: RDD of ``(features, label)``; features a numpy array (or a tuple of arrays
            for a multi-input model), label a scalar or an array. Floating values are stored in
            the model's parameter dtype, integers as int64. A
            :class:`sparkdl.runners.LocalPartitions` instead runs the same loop in this
            process, without Spark (bitwise the same result on the same partitions).
        criterion: a loss with reduction ``'mean'`` (the default of torch's losses) or ``'sum'``;
            optional with ``training_step`` (then, when given, it serves validation's
            :class:`~sparkdl.metrics.Loss` and the one-output accuracy threshold).
        optimizer: a ``torch.optim.Optimizer`` built over ``model.parameters()`` (required),
            or a list of them over disjoint parameters, stepped in order
            (:class:`sparkdl.OptimizerSequence`; e.g. ``SparseAdam`` for the embedding tables
            built with ``sparse=True``, ``Adam`` for the rest). Tables with ``sparse=True``
            travel as the rows a batch touched (:mod:`sparkdl.transport.table_rows`).
        batch_size: the global mini-batch size (any positive int; required).
        end_trigger: when to stop; default ``MaxEpoch(1)``.
        seed: fixes every random choice (the per-partition shuffles).
        lr_scheduler: any torch LR scheduler over ``optimizer``; with several optimizers, a
            list of schedulers, each over one of them.
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
        device: where tasks compute: ``"auto"`` (default: the GPU Spark assigned to the task when
            it has one and CUDA is available, else the CPU), ``"cpu"``, or ``"cuda"`` (an error
            before any cluster work when the cluster schedules no GPUs). The optimizer always
            runs on the driver's CPU.
        precision: ``"32"`` (default), ``"bf16-mixed"`` (autocast to bfloat16 in the tasks) or
            ``"16-mixed"`` (autocast to float16 with one global loss scale, decided on the
            driver by torch GradScaler's rules).
        train_transform: optional augmentation ``(features, rng) -> features`` applied in the
            tasks to every training batch (never to validation): ``features`` is the batch's
            array (a list of arrays for a multi-input model), ``rng`` a numpy Generator seeded
            by ``(seed, iteration, partition)``
            (:func:`sparkdl.data.batch_plan.transform_generator`), so runs stay bitwise
            reproducible. With ``micro_batch_size`` it is called per micro-batch, drawing from
            the same generator in order.
        sequence_inputs: positions of the inputs that are variable-length 1-d arrays (a user's
            history, a title's tokens): stored as values plus offsets and padded per task batch
            to its longest row with ``padding_value``; the model then receives, for each, the
            padded tensor ``[batch, longest]`` followed by the lengths ``[batch]`` (int64)
            (:mod:`sparkdl.data.ragged`).
        padding_value: what pads the sequences (default 0).
        collate: optional ``(inputs) -> model arguments`` replacing that rule: ``inputs`` holds
            :class:`sparkdl.data.ragged.Ragged` for sequences and arrays otherwise.
        sample_weights: every record's features end with the sample's weight (a tuple
            ``(x, ..., weight)``): the loss is the weighted mean over the union batch,
            ``sum(w_i * loss_i) / sum(w_i)`` (the criterion, a torch loss with
            ``reduction='mean'`` and no class weights, is evaluated with ``reduction='none'``;
            a sample's loss is the mean of its values, ignored targets included). Validation
            metrics ignore the weights.
        training_step: your own step, ``(model, inputs, target) -> loss``, replacing
            ``criterion(model(*inputs), target)``: ``inputs`` are the model arguments of the
            task's rows; the loss is their mean, or ``(loss_sum, normaliser)`` for a loss whose
            normaliser is not the row count (:mod:`sparkdl.training_step`). The engine still
            owns backward, micro-batches, precision, clipping, the AllReduce and the optimizer:
            the result equals single-process training calling the same step on the union batch
            for losses that are sums or means over samples (a loss coupling the rows of a batch
            is computed per task, like BatchNorm's statistics). Tried on a few rows (from the
            job that caches the shards) before any gradient job. Draw randomness from torch
            (seeded per task), not numpy or ``random``, to stay bitwise reproducible.
        validation_step: optional ``(model, inputs, target) -> output`` replacing
            ``model(*inputs)`` in validation; the metrics read its output.
        sub_replicas: how a task with several cores (``spark.task.cpus``) uses them: ``None``
            (default) runs that many sub-replicas of the model in threads, each on a contiguous
            part of the task's share, summed inside the task in a fixed order, for models with
            convolutions or attention that neither draw random numbers nor change buffers in
            training, without ``train_transform``; otherwise (and with one core per task or
            GPUs) one replica with intra-op threads; ``1``: always the latter; ``k``: ``k``
            sub-replicas (an error for a model that cannot). Exact either way
            (:mod:`sparkdl.engine.fit.checks.task_parallelism`).
        exchange_dir: for the DataFrame runner that the estimators use under Spark Connect
            (:mod:`sparkdl.runners.connect_dataframe`): where weights above
            :data:`sparkdl.executor.exchange.CLOSURE_MAX_BYTES` travel; unused by RDD runs.

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

    def __init__(self, model: nn.Module, training_rdd: Any, criterion: Any = None,
                 optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
                 batch_size: int | None = None,
                 end_trigger: Trigger | None = None, seed: int = 0,
                 lr_scheduler: Any = None, lr_scheduler_step: str = "epoch",
                 micro_batch_size: int | None = None, shuffle: bool = True,
                 allreduce: str = "auto", num_blocks: int | None = None,
                 progress_bar: bool | None = None, compression: str | None = None,
                 device: str = "auto", precision: str = "32",
                 train_transform: Callable[[Any, Any], Any] | None = None,
                 sequence_inputs: Sequence[int] = (), padding_value: float = 0.0,
                 collate: Callable[[list[Any]], Sequence[Any]] | None = None,
                 sample_weights: bool = False, exchange_dir: str | None = None,
                 training_step: TrainingStep | None = None,
                 validation_step: ValidationStep | None = None,
                 sub_replicas: int | None = None) -> None:
        self.model = check_type("model", _OWNER, model, nn.Module, "a torch.nn.Module")
        self.training_step, self.validation_step = check_steps(
            _OWNER, criterion, training_step, validation_step, sample_weights)
        if optimizer is None:
            raise argument_error("optimizer", _OWNER, "a torch.optim.Optimizer built over "
                                 "model.parameters()", optimizer)
        if batch_size is None:
            raise argument_error("batch_size", _OWNER, "a positive int", batch_size)
        if train_transform is not None and not callable(train_transform):
            raise argument_error("train_transform", _OWNER,
                                 "a function (features, numpy Generator) -> features",
                                 train_transform)
        self.train_transform = train_transform
        self.sequence_inputs = tuple(check_int("sequence_inputs", _OWNER, k)
                                     for k in sequence_inputs)
        if any(k < 0 for k in self.sequence_inputs):
            raise argument_error("sequence_inputs", _OWNER, "input positions >= 0",
                                 list(sequence_inputs))
        if isinstance(padding_value, bool) or not isinstance(padding_value, (int, float)):
            raise argument_error("padding_value", _OWNER, "a number", padding_value)
        self.padding_value = float(padding_value)
        if collate is not None and not callable(collate):
            raise argument_error("collate", _OWNER, "a function (list of inputs) -> model "
                                 "arguments", collate)
        self.collate = collate
        check_type("sample_weights", _OWNER, sample_weights, bool, "a bool")
        if exchange_dir is not None and (not isinstance(exchange_dir, str)
                                         or not exchange_dir.strip()):
            raise argument_error("exchange_dir", _OWNER, "a directory path or URI, or None",
                                 exchange_dir)
        self.exchange_dir = exchange_dir
        self.sub_replicas = check_positive_int("sub_replicas", _OWNER, sub_replicas,
                                               allow_none=True)
        if sample_weights and getattr(criterion, "weight", None) is not None:
            raise InvalidArgumentError(
                "sample_weights=True cannot be combined with a criterion that has class "
                f"weights ({type(criterion).__name__}(weight=...)): fold the class weights into "
                "the sample weights instead.")
        if sample_weights and not (isinstance(criterion, nn.Module) and
                                   getattr(criterion, "reduction", None) == "mean"):
            raise InvalidArgumentError(
                f"sample_weights=True needs a torch loss module with reduction='mean' (its "
                f"per-sample values are weighted); got {type(criterion).__name__}"
                + (f" with reduction={criterion.reduction!r}"
                   if hasattr(criterion, "reduction") else "") + ".")
        devices = sorted({str(t.device) for t in list(model.parameters()) + list(model.buffers())})
        if devices and devices != ["cpu"]:
            raise InvalidArgumentError(
                f"The 'model' argument of {_OWNER} must be on the CPU (it is on {devices}): the "
                "optimizer runs on the driver's CPU and every task moves its own replica to its "
                "device (device='auto' or 'cuda'). Pass the model before .cuda() / .to(...).")
        self.training_rdd = check_training_data("training_rdd", _OWNER, training_rdd)
        self.reduction = (check_criterion(_OWNER, criterion) if criterion is not None
                          else "mean")
        self.criterion = criterion
        optimizer = as_optimizer(optimizer)
        self.optimizer = check_optimizer(_OWNER, optimizer, model)
        self.end_trigger = check_type("end_trigger", _OWNER,
                                      end_trigger if end_trigger is not None else MaxEpoch(1),
                                      Trigger, "a sparkdl.triggers.Trigger such as MaxEpoch(5)")
        self.lr_scheduler = check_lr_scheduler(_OWNER, as_scheduler(lr_scheduler, optimizer),
                                               optimizer)
        if progress_bar is not None and not isinstance(progress_bar, bool):
            raise argument_error("progress_bar", _OWNER, "True, False or None (automatic)",
                                 progress_bar)
        self.settings = RunSettings(
            batch_size=check_positive_int("batch_size", _OWNER, batch_size),
            seed=check_int("seed", _OWNER, seed),
            shuffle=check_type("shuffle", _OWNER, shuffle, bool, "a bool"),
            micro_batch_size=check_positive_int("micro_batch_size", _OWNER, micro_batch_size,
                                                allow_none=True),
            lr_scheduler_step=check_choice("lr_scheduler_step", _OWNER, lr_scheduler_step,
                                           ("epoch", "iteration")),
            runner_options=RunnerOptions(
                allreduce=check_choice("allreduce", _OWNER, allreduce,
                                       ("auto", "shuffle", "driver")),
                num_blocks=check_positive_int("num_blocks", _OWNER, num_blocks, allow_none=True),
                compression=check_choice("compression", _OWNER, compression, COMPRESSIONS),
                device=check_choice("device", _OWNER, device, DEVICES),
                precision=check_choice("precision", _OWNER, precision, PRECISIONS)),
            progress_bar=progress_bar, sample_weights=sample_weights)
        if precision == "16-mixed" and needs_closure(optimizer):
            raise InvalidArgumentError(
                f"precision='16-mixed' cannot be used with {type(optimizer).__name__}, whose "
                "step needs a closure (torch's GradScaler does not support closures either); use "
                "precision='bf16-mixed' or '32'.")
        self.layout = ParamLayout(model)
        self._validation: Validation | None = None
        self._checkpoint_setup: CheckpointSetup | None = None
        self._clipping: GradientClipping | None = None
        self._mlflow: MlflowSetup | None = None
        self._fit_name: str | None = None
        self._identity_extra: dict[str, Any] | None = None
        """What a caller adds to the fit identity (the estimators: their Params)."""
        self.mlflow_run_id: str | None = None
        self.summary = TrainingSummary()
        self.iteration = 0
        self.data_spec: DataSpec | None = None
        self._needs_prediction = False
        """Whether ``model(*inputs)`` must give a prediction tensor even with a training step
        (the estimators' ``transform``): checked by the dry run, before training."""
        self._input_names: tuple[str, ...] = ()
        """The features' column names (the estimators), for the errors of embedding ids out of
        their table's range (:mod:`sparkdl.executor.id_checks`)."""

    def _concurrency_hazard(self) -> str | None:
        """Why sub-replicas cannot train this model exactly (None: they can), tried on the
        training rows the dry run used."""
        assert self.data_spec is not None
        inputs, target = sample_batch(self.data_spec, self.layout.param_dtype,
                                      self._model_arguments)
        return concurrency_hazard(self.model, self.criterion, self.training_step, inputs, target)

    def _model_arguments(self, features: list[Any]) -> list[Any]:
        if self.settings.sample_weights:        # the last input is the samples' weight
            features = features[:-1]
        return model_arguments(features, self.padding_value, self.collate)

    @property
    def batch_size(self) -> int:
        """The global mini-batch size (may be set before :meth:`optimize`)."""
        return self.settings.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.settings = dataclasses.replace(
            self.settings, batch_size=check_positive_int("batch_size", _OWNER, value))

    @property
    def seed(self) -> int:
        """The run's seed (may be set before :meth:`optimize`)."""
        return self.settings.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.settings = dataclasses.replace(self.settings, seed=check_int("seed", _OWNER, value))

    def set_validation(self, rdd: Any, trigger: Trigger,
                       metrics: Sequence[ValidationMetric],
                       batch_size: int = 1024) -> "DistriOptimizer":
        """Evaluate ``metrics`` on ``rdd`` whenever ``trigger`` fires (results in the summary
        and the log).

        Example: ``opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy(), Loss()])``.
        """
        owner = f"{_OWNER}.set_validation"
        check_training_data("rdd", owner, rdd)
        check_type("trigger", owner, trigger, Trigger, "a sparkdl.triggers.Trigger")
        if isinstance(metrics, ValidationMetric):
            metrics = [metrics]
        if not metrics or not all(isinstance(m, ValidationMetric) for m in metrics):
            raise argument_error("metrics", owner, "a non-empty list of "
                                 "sparkdl.metrics.ValidationMetric", metrics)
        self._validation = Validation(rdd, trigger, list(metrics),
                                      check_positive_int("batch_size", owner, batch_size))
        return self

    def set_checkpoint(self, path: str, trigger: Trigger, keep_last: int = 3,
                       resume: bool = True, by_fit: bool = False) -> "DistriOptimizer":
        """Write the whole training state to ``path`` whenever ``trigger`` fires.

        A checkpoint holds the model, optimizer and scheduler states, the iteration and epoch,
        torch's RNG state and the summary so far; it is written atomically (temporary file, then
        rename) through Spark's Hadoop FileSystem (``hdfs://``, ``s3a://``, ``file://`` or a plain
        path). Only the newest ``keep_last`` are kept. With ``resume=True`` (the default),
        :meth:`optimize` continues from the newest checkpoint already in ``path``, to the same
        result as an uninterrupted run; with ``resume=False`` the directory must hold none.
        The directory is checked for writing now, before any cluster work.

        A checkpoint belongs to its fit: it is resumed only by a run with the same identity,
        derived from everything that decides the result (every argument and setter but those
        that cannot change the weights, objects by their content, the data's content hashes:
        :mod:`sparkdl.engine.fit.resume.fit_identity`; not the end trigger's epoch or iteration count:
        training longer resumes); any other run gets a
        :class:`~sparkdl.errors.CheckpointError` naming what differs. With
        ``by_fit=True`` each fit instead writes to, and resumes from, its own subdirectory
        ``fit-<hash of that key>`` (what the estimators do, so every setting and fold of a tuning
        grid has its own).

        Example: ``opt.set_checkpoint("hdfs:///ckpt/run1", EveryEpoch(), keep_last=2)``.
        """
        owner = f"{_OWNER}.set_checkpoint"
        if not isinstance(path, str) or not path.strip():
            raise argument_error("path", owner, "a non-empty directory path or URI", path)
        check_type("trigger", owner, trigger, Trigger,
                   "a sparkdl.triggers.Trigger such as EveryEpoch()")
        keep_last = check_positive_int("keep_last", owner, keep_last)
        check_type("resume", owner, resume, bool, "a bool")
        check_type("by_fit", owner, by_fit, bool, "a bool")
        store = self._checkpoint_store(path)
        store.check_writable()
        if not resume and store.iterations():
            raise CheckpointError(
                f"The checkpoint directory {path!r} already holds checkpoints "
                f"(iterations {store.iterations()}) and resume=False: choose an empty directory "
                "or pass resume=True to continue from the newest one.")
        self._checkpoint_setup = CheckpointSetup(path, trigger, keep_last, resume, by_fit)
        return self

    def set_gradient_clipping(self, max_norm: float, norm_type: float = 2.0
                              ) -> "DistriOptimizer":
        """Clip the union gradient to total norm ``max_norm`` before every optimizer step,
        exactly as ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)``
        in single-process training.

        Example: ``opt.set_gradient_clipping(1.0)``.
        """
        max_norm, norm_type = check_norm_clipping(f"{_OWNER}.set_gradient_clipping", max_norm,
                                                  norm_type)
        current = self._clipping or GradientClipping()
        self._clipping = dataclasses.replace(current, max_norm=max_norm, norm_type=norm_type)
        return self

    def set_constant_gradient_clipping(self, min_value: float, max_value: float
                                       ) -> "DistriOptimizer":
        """Clamp every value of the union gradient into ``[min_value, max_value]`` before every
        optimizer step (``torch.nn.utils.clip_grad_value_`` for ``[-v, v]``); applied before
        norm clipping when both are set.

        Example: ``opt.set_constant_gradient_clipping(-0.5, 0.5)``.
        """
        low, high = check_value_clipping(f"{_OWNER}.set_constant_gradient_clipping",
                                         min_value, max_value)
        current = self._clipping or GradientClipping()
        self._clipping = dataclasses.replace(current, min_value=low, max_value=high)
        return self

    def _check_trigger_metrics(self) -> None:
        """Every validation metric a trigger reads must be computed by ``set_validation``."""
        triggers = [("end_trigger", self.end_trigger)]
        if self._checkpoint_setup is not None:
            triggers.append(("checkpoint trigger", self._checkpoint_setup.trigger))
        if self._validation is not None:
            triggers.append(("validation trigger", self._validation.trigger))
        validated = {m.name for m in self._validation.metrics} if self._validation else set()
        for what, trigger in triggers:
            missing = sorted(trigger.metric_names() - validated)
            if missing:
                raise InvalidArgumentError(
                    f"The {what} {trigger!r} reads the validation metric {missing[0]!r}, which "
                    + (f"set_validation does not compute (it computes {sorted(validated)})"
                       if validated else "is never computed: call set_validation(data, trigger, "
                       "[...]) with that metric") + ".")

    def _checkpoint_store(self, path: str) -> CheckpointStore:
        from ..runners.in_process import LocalPartitions
        from ..storage.arrow_files import ArrowFiles
        from ..storage.hadoop_files import HadoopFiles

        data = self.training_rdd
        # without Spark (LocalPartitions) or a JVM (Spark Connect): pyarrow's file systems
        sc = None if isinstance(data, LocalPartitions) else getattr(data, "context", None)
        return CheckpointStore(path, HadoopFiles(sc) if sc is not None else ArrowFiles())

    def set_fit_identity(self, name: str) -> "DistriOptimizer":
        """Name this fit for its checkpoints. The identity of a fit is derived from everything
        that decides its result (:mod:`sparkdl.engine.fit.resume.fit_identity`); an object sparkdl cannot
        hash deterministically (a function closing over a lock or a session) is refused unless
        the fit has a name: then ``name`` stands for each whole argument that could not be
        hashed, and a fit is resumed only by a fit with the same name and the same hashable rest. Give a new name
        whenever such an object changes what it computes.

        Example: ``opt.set_fit_identity("two-tower-v3").set_checkpoint(path, EveryEpoch())``.
        """
        if not isinstance(name, str) or not name.strip():
            raise argument_error("name", f"{_OWNER}.set_fit_identity", "a non-empty string",
                                 name)
        self._fit_name = name
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
        self.settings = dataclasses.replace(self.settings, tensorboard_dir=log_dir)
        return self

    def set_mlflow(self, run_id: str | None = None, *, parent_run_id: str | None = None,
                   run_name: str | None = None, params: Mapping[str, Any] | None = None,
                   tags: Mapping[str, str] | None = None,
                   flush_interval_s: float = FLUSH_INTERVAL_S,
                   finish_timeout_s: float = FINISH_TIMEOUT_S) -> "DistriOptimizer":
        """Also log the run to MLflow (needs ``pip install 'sparkdl[mlflow]'``; checked now):
        the settings as parameters once, then ``train/loss``, ``train/samples_per_s``,
        ``train/learning_rate`` per iteration and ``validation/<metric>`` per validation with
        ``step`` = the iteration, and the summary as the artifact
        ``sparkdl/training_summary.json`` (:mod:`sparkdl.engine.fit.reports.mlflow_tracking`).

        The run: ``run_id`` (left open); else a new child run of ``parent_run_id``; else the run
        active in the thread that calls :meth:`optimize`; else a new run (``run_name``) in
        MLflow's current experiment. A run created here ends with :meth:`optimize`. ``params``
        replaces the engine's settings as the run's parameters (the estimators pass their
        Params); ``tags`` are set on the run. Values travel from a background thread every
        ``flush_interval_s``; :meth:`optimize` waits at most ``finish_timeout_s`` at its end.
        A tracking server that is down or fails never fails training: a warning says why and
        training goes on. The run's id is in ``mlflow_run_id`` after :meth:`optimize`.

        Example::

            mlflow.set_tracking_uri("sqlite:///mlflow.db")
            with mlflow.start_run():
                opt.set_mlflow().optimize()
        """
        owner = f"{_OWNER}.set_mlflow"
        for name, value in (("run_id", run_id), ("parent_run_id", parent_run_id),
                            ("run_name", run_name)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise argument_error(name, owner, "a non-empty string or None", value)
        for name, mapping in (("params", params), ("tags", tags)):
            if mapping is not None and (not isinstance(mapping, Mapping) or
                                        not all(isinstance(k, str) for k in mapping)):
                raise argument_error(name, owner, "a dict with string keys or None", mapping)
        for name, seconds in (("flush_interval_s", flush_interval_s),
                              ("finish_timeout_s", finish_timeout_s)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                    not seconds > 0:
                raise argument_error(name, owner, "a positive number of seconds", seconds)
        check_mlflow(owner)
        self._mlflow = MlflowSetup(run_id, parent_run_id, run_name,
                                   dict(params) if params is not None else None,
                                   {k: str(v) for k, v in (tags or {}).items()},
                                   float(flush_interval_s), float(finish_timeout_s))
        return self

    def _mlflow_tracker(self, plan: BatchPlan) -> MlflowTracker | None:
        setup = self._mlflow
        if setup is None:
            return None
        import mlflow

        params = setup.params if setup.params is not None else engine_params(self, plan)
        tracker = MlflowTracker(setup, params, mlflow.get_tracking_uri(), active_run_id())
        tracker.start()
        return tracker

    # ----------------------------------------------------------------------------- training
    def optimize(self) -> nn.Module:
        """Train until the end trigger fires; return the trained model (the same object).

        This is a set of one fit (:class:`sparkdl.engine.fit_set.FitSet`): to train several
        fits over the same data in one sequence of jobs, give them to ``FitSet``."""
        from .fit_set import FitSet

        FitSet([self]).run()
        return self.model

    def _begin(self, runner: Any, hop: tuple[int, int] | None = None) -> "_FitRun":
        """Everything before this fit's first iteration, on ``runner`` (a
        :class:`sparkdl.engine.fit_set.FitView` of the pass's runner): the checks, the
        checkpoint directory and its resume, the data held (once per pass), the dry run, the
        plan, the model shipped to the tasks. Returns the fit's run, whose ``loop`` the pass
        drives; :meth:`_end` ends it, whatever happened. ``hop``: ``(seed, position)`` when
        the fit trains by model hopping (:mod:`sparkdl.engine.strategies.hop.jobs`): its plan is then a
        :class:`~sparkdl.engine.strategies.hop.order.HopPlan`."""
        if hop is not None:
            options = self.settings.runner_options
            check_hop_settings(_OWNER, options.precision, options.device)
        self._check_trigger_metrics()
        self.layout = ParamLayout(self.model)        # as the model is now (requires_grad flags)
        check_sparse_gradients(_OWNER, self.model, self.layout, self.optimizer,
                               self._clipping is not None)
        for trigger in self.end_trigger.walk():
            trigger.reset()
        runner.check_device(self.settings.runner_options.device)
        setup = self._checkpoint_setup
        # only checkpoints need the identity (hashing every weight and function costs time)
        identity = fit_identity(self) if setup is not None else {}
        checkpoints = (Checkpoints(setup, self._checkpoint_store(setup.path))
                       if setup is not None and not setup.by_fit else None)
        run = _FitRun(runner)
        if checkpoints is not None:      # this process's other fits keep out of its directory
            run.held.enter_context(exclusive_directory(setup.path))
        try:
            resumed = checkpoints.latest(self.model) if checkpoints is not None else None
            dtype = self.layout.data_dtype.str
            train = runner.load(self.training_rdd, "training", dtype, self.sequence_inputs)
            self.data_spec = summarize(train.summaries, "training")
            param_dtype = self.layout.param_dtype
            arguments = self._model_arguments
            steps = (self.training_step, self.validation_step)
            dry_run(self.model, self.criterion, self.data_spec, "training", dtype=param_dtype,
                    arguments=arguments, steps=steps, prediction=self._needs_prediction,
                    names=self._input_names, collate=self.collate)
            if self._validation is not None:
                self._validation.held = runner.load(self._validation.data, "validation", dtype,
                                                    self.sequence_inputs)
                dry_run(self.model, self.criterion,
                        summarize(self._validation.held.summaries, "validation"), "validation",
                        self._validation.metrics, param_dtype, arguments, steps,
                        names=self._input_names, collate=self.collate)
                if setup is not None and validation_decides(self):
                    identity["validation"]["data"] = data_digest(
                        self._validation.held.summaries)
            plan: Any = (BatchPlan(self.data_spec.partition_sizes, self.batch_size, self.seed,
                                   self.settings.shuffle) if hop is None else
                         HopPlan(list(self.data_spec.partition_sizes), self.batch_size, *hop))
            sub_replicas, cores_use = choose_sub_replicas(
                self.sub_replicas, runner.task_cores(),
                self.settings.runner_options.device == "cuda" or runner.schedules_gpus(),
                lambda: self._concurrency_hazard(), self.train_transform is not None,
                prefers_sub_replicas(self.model))
            settings = dataclasses.replace(self.settings, sub_replicas=sub_replicas)
            ctx = RunContext(settings, self.model, self.criterion, self.reduction,
                             self.optimizer, self.lr_scheduler, self.layout, self.end_trigger,
                             runner, train, plan, self._validation, checkpoints, self._clipping,
                             LossScaler() if self.settings.runner_options.precision == "16-mixed"
                             else None)
            run.ctx = ctx
            if setup is not None:
                ctx.fit_key = dict(identity, data=data_digest(train.summaries))
            ctx.training_step = self.training_step
            if setup is not None and setup.by_fit:   # this fit's own subdirectory
                directory = f"{setup.path.rstrip('/')}/{identity_directory(ctx.resume_key())}"
                run.held.enter_context(exclusive_directory(directory))
                ctx.checkpoints = checkpoints = Checkpoints(
                    dataclasses.replace(setup, path=directory), self._checkpoint_store(directory))
                resumed = checkpoints.latest(self.model)
                note_settings(setup.path.rstrip("/"), directory, ctx.resume_key(),
                              checkpoints.store.files, resumed is not None)
                log.info("checkpoints of this fit go to %s", directory)
            if resumed is not None:
                checkpoints.restore(ctx, resumed)  # type: ignore[union-attr]
            run.spec = ReplicaSpec(self.model, self.criterion, self.reduction,
                                   self.train_transform, self.padding_value, self.collate,
                                   self.settings.sample_weights, self.training_step,
                                   self.validation_step, self._input_names)
            if hop is None or self._validation is not None:  # a hop ships it per job, and
                how = runner.start(run.spec, self.layout,      # here only for validation
                                   self.settings.runner_options, train)
            if hop is None:
                log.info("training on %d samples in %d partitions: global batch %d, %d "
                         "iterations per epoch, %s", plan.num_samples, plan.num_partitions,
                         self.batch_size, plan.iterations_per_epoch, how)
            else:
                log.info("training on %d samples in %d partitions by model hopping: batch %d, "
                         "%d sub-epochs per epoch, rotation position %d", plan.num_samples,
                         plan.num_partitions, self.batch_size, plan.iterations_per_epoch,
                         plan.position)
            log.info("tasks use their cores as %s", cores_use)
            run.tracker = self._mlflow_tracker(plan)
            ctx.listeners = [run.tracker] if run.tracker is not None else []
            run.loop = TrainingLoop(ctx)
        except BaseException as exc:
            run.failure = exc
            self._end(run)
            raise
        return run

    def _end(self, run: "_FitRun") -> None:
        """After the fit's last iteration, or its failure (``run.failure``): the summary, the
        checkpoint directory released, the fit's replicas released (the pass closes its
        runner), MLflow told."""
        if run.ended:
            return
        run.ended = True
        run.held.close()
        ctx = run.ctx
        if ctx is not None:
            self.summary, self.iteration = ctx.summary, ctx.iteration
            _count_rebuilds(ctx.summary, [ctx.train] + (
                [self._validation.held] if self._validation is not None and
                self._validation.held is not None else []))
        if self._validation is not None:
            self._validation.held = None
        run.runner.close()
        if run.tracker is not None:
            run.tracker.finish(self.summary, run.failure)
            self.mlflow_run_id = run.tracker.run_id


@dataclasses.dataclass
class _FitRun:
    """One fit's run in a pass: its runner view, context, loop, checkpoint directories held,
    MLflow tracker and failure."""

    runner: Any
    ctx: RunContext | None = None
    spec: ReplicaSpec | None = None
    loop: TrainingLoop | None = None
    tracker: MlflowTracker | None = None
    failure: BaseException | None = None
    held: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)
    ended: bool = False
