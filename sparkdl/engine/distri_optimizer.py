"""``DistriOptimizer``: the engine's public API (driver side).

A thin facade: it checks every argument when constructed (before any cluster work) and fills a
:class:`~sparkdl.engine.fit.spec.Fit` (what is trained), records in it what ``set_validation``
/ ``set_checkpoint`` / ``set_tensorboard`` / ``set_mlflow`` ask for, and :meth:`optimize` hands
it to a :class:`~sparkdl.engine.fit_set.FitSet` of one, which opens it
(:mod:`sparkdl.engine.fit.opening`) and has its strategy run it
(:mod:`sparkdl.engine.strategies`). Where the jobs run is the runner's business
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

from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..training_step import TrainingStep, ValidationStep
from ..triggers import Trigger
from ..metrics import ValidationMetric
from .fit import building as checks
from .fit.reports.mlflow_tracking import FINISH_TIMEOUT_S, FLUSH_INTERVAL_S
from .fit.spec import Fit

__all__ = ["DistriOptimizer"]


class DistriOptimizer:
    """Train a PyTorch model with synchronous data-parallel mini-batch SGD on a Spark RDD.

    The result equals single-process PyTorch trained on the same global batches (see
    :class:`sparkdl.BatchPlan` for how batches are drawn), up to float rounding, and
    two runs with the same seed and partitioning give bitwise-identical weights.

    Args:
        model: the ``nn.Module`` to train; it is trained in place and returned by :meth:`optimize`.
            Or a :class:`sparkdl.adapters.PretrainedModel`: a Hugging Face model by where it is
            stored, its base loaded by the executors (the driver holds the trainable
            parameters; :meth:`optimize` returns the ``peft`` model); ``optimizer`` is then a
            callable ``params -> Optimizer`` and ``lr_scheduler`` may be one
            ``optimizer -> scheduler``.
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
        local_steps: H, the iterations of a local round (default 1: synchronous SGD, one
            job per iteration). Above 1, every partition trains its own copy of ``optimizer``
            for H iterations on exactly the samples synchronous SGD gives it, then the
            samples-weighted average delta goes to ``outer_optimizer``: one Spark job, one
            broadcast and one AllReduce per round instead of per iteration. A round never
            crosses an epoch's end; triggers are asked at a round's end (docs: local rounds).
        outer_optimizer: how the averaged delta updates the global weights: ``None`` or
            ``"average"`` (SGD lr 1.0, plain averaging), ``"nesterov"`` (DiLoCo's SGD lr 0.7,
            momentum 0.9, Nesterov), or a callable ``params -> torch optimizer``. Given with
            ``local_steps=1`` it trains in rounds of one iteration.
        sync_warmup: synchronous iterations before the rounds begin (post-local SGD); each
            partition's optimizer then starts from the synchronous optimizer's state.
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
                 sub_replicas: int | None = None, local_steps: int = 1,
                 outer_optimizer: str | Callable[[list[torch.nn.Parameter]],
                                                 torch.optim.Optimizer] | None = None,
                 sync_warmup: int = 0) -> None:
        self.fit: Fit = checks.fit_from_arguments(
            model, training_rdd, criterion, optimizer, batch_size, end_trigger, seed,
            lr_scheduler, lr_scheduler_step, micro_batch_size, shuffle, allreduce, num_blocks,
            progress_bar, compression, device, precision, train_transform, sequence_inputs,
            padding_value, collate, sample_weights, exchange_dir, training_step, validation_step,
            sub_replicas, local_steps, outer_optimizer, sync_warmup)
        """The fit this facade fills (:class:`~sparkdl.engine.fit.spec.Fit`): its attributes
        (``model``, ``end_trigger``, ``batch_size``, ``summary``, ``iteration``...) read and
        set through the facade too."""

    def __getattr__(self, name: str) -> Any:
        fit = self.__dict__.get("fit")
        if fit is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(fit, name)

    def __setattr__(self, name: str, value: Any) -> None:
        fit = self.__dict__.get("fit")
        if fit is not None and name != "fit" and hasattr(fit, name):
            setattr(fit, name, value)
        else:
            object.__setattr__(self, name, value)

    def set_validation(self, rdd: Any, trigger: Trigger,
                       metrics: Sequence[ValidationMetric],
                       batch_size: int = 1024) -> "DistriOptimizer":
        """Evaluate ``metrics`` on ``rdd`` whenever ``trigger`` fires (results in the summary
        and the log).

        Example: ``opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy(), Loss()])``.
        """
        self.fit.validation = checks.validation_setup(rdd, trigger, metrics, batch_size)
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
        :mod:`sparkdl.engine.fit.resume.fit_identity`; not the end trigger's epoch or iteration
        count: training longer resumes); any other run gets a
        :class:`~sparkdl.errors.CheckpointError` naming what differs. With
        ``by_fit=True`` each fit instead writes to, and resumes from, its own subdirectory
        ``fit-<hash of that key>`` (what the estimators do, so every setting and fold of a tuning
        grid has its own).

        Example: ``opt.set_checkpoint("hdfs:///ckpt/run1", EveryEpoch(), keep_last=2)``.
        """
        self.fit.checkpoint_setup = checks.checkpoint_setup(self.fit, path, trigger, keep_last,
                                                            resume, by_fit)
        return self

    def set_gradient_clipping(self, max_norm: float, norm_type: float = 2.0
                              ) -> "DistriOptimizer":
        """Clip the union gradient to total norm ``max_norm`` before every optimizer step,
        exactly as ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)``
        in single-process training.

        Example: ``opt.set_gradient_clipping(1.0)``.
        """
        self.fit.clipping = checks.clipping_setup(self.fit.clipping, max_norm, norm_type)
        return self

    def set_constant_gradient_clipping(self, min_value: float, max_value: float
                                       ) -> "DistriOptimizer":
        """Clamp every value of the union gradient into ``[min_value, max_value]`` before every
        optimizer step (``torch.nn.utils.clip_grad_value_`` for ``[-v, v]``); applied before
        norm clipping when both are set.

        Example: ``opt.set_constant_gradient_clipping(-0.5, 0.5)``.
        """
        self.fit.clipping = checks.clipping_setup(self.fit.clipping,
                                                  value_range=(min_value, max_value))
        return self

    def set_fit_identity(self, name: str) -> "DistriOptimizer":
        """Name this fit for its checkpoints. The identity of a fit is derived from everything
        that decides its result (:mod:`sparkdl.engine.fit.resume.fit_identity`); an object
        sparkdl cannot hash deterministically (a function closing over a lock or a session) is
        refused unless the fit has a name: then ``name`` stands for each whole argument that
        could not be hashed, and a fit is resumed only by a fit with the same name and the same
        hashable rest. Give a new name whenever such an object changes what it computes.

        Example: ``opt.set_fit_identity("two-tower-v3").set_checkpoint(path, EveryEpoch())``.
        """
        self.fit.name = checks.fit_name(name)
        return self

    def set_tensorboard(self, log_dir: str) -> "DistriOptimizer":
        """Also write training scalars (loss, learning rate, samples/s per iteration) and
        validation metrics as TensorBoard summaries under ``log_dir`` (a local directory on the
        driver). Needs the ``tensorboard`` package; checked now.

        Example: ``opt.set_tensorboard("/tmp/tb/run1")``, then ``tensorboard --logdir /tmp/tb``.
        """
        self.fit.settings = checks.tensorboard_setup(self.fit.settings, log_dir)
        return self

    def set_mlflow(self, run_id: str | None = None, *, parent_run_id: str | None = None,
                   run_name: str | None = None, params: Mapping[str, Any] | None = None,
                   tags: Mapping[str, str] | None = None,
                   flush_interval_s: float = FLUSH_INTERVAL_S,
                   finish_timeout_s: float = FINISH_TIMEOUT_S) -> "DistriOptimizer":
        """Also log the run to MLflow (needs ``pip install 'sparkdl-torch[mlflow]'``; checked now):
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
        self.fit.mlflow = checks.mlflow_setup(run_id, parent_run_id, run_name, params, tags,
                                              flush_interval_s, finish_timeout_s)
        return self

    # ----------------------------------------------------------------------------- training
    def optimize(self) -> nn.Module:
        """Train until the end trigger fires; return the trained model (the same object).

        This is a set of one fit (:class:`sparkdl.engine.fit_set.FitSet`): to train several
        fits over the same data in one sequence of jobs, give them to ``FitSet``."""
        from .fit_set import FitSet

        FitSet([self]).run()
        return self.model
