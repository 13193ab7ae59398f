"""How a task uses its cores: one replica with intra-op threads, or sub-replicas in threads
(driver side; the tasks' side is :mod:`sparkdl.executor.sub_replicas`).

The choice is made once per run, before any gradient job, and never depends on where a task
runs or how long it takes, so a retried or moved task computes bitwise the same vector:

* ``sub_replicas=None`` (the default): with tasks of ``c > 1`` cores (``spark.task.cpus``) on
  CPU executors, ``c`` sub-replicas for the model kinds that gain from them
  (:func:`prefers_sub_replicas`: convolutions and attention, measured by
  ``bench/task_aggregation.py``), unless the model draws random numbers (dropout) or changes
  buffers (BatchNorm) in a training step, or the run augments its batches; otherwise one
  replica with ``c`` intra-op threads (MLPs and embedding models, whose large matrix products
  already keep the cores busy). One core per task, or GPUs: one replica.
* ``sub_replicas=1``: one replica with the task's cores as intra-op threads.
* ``sub_replicas=k > 1``: ``k`` sub-replicas; a model that cannot run so is an error here.

How the tasks of an iteration share the cluster: an RDD with more partitions than the cluster's
task slots (:func:`sparkdl.task_slots.task_slots`) keeps them (its batch plan depends on them),
and :func:`warn_waves` says once, before training, in how many waves each iteration runs.

Example::

    count, how = choose_sub_replicas(None, runner.task_cores(), False, hazard)
    warn_waves(fit.training_rdd, runner, "auto")   # a warning where partitions > task slots
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ....errors import InvalidArgumentError
from ....executor.replicas import set_training_modes, training_modes
from ....task_slots import task_slots
from ....training_step import step_loss_terms
from ..optim.rng_isolation import private_torch_rng

__all__ = ["choose_sub_replicas", "concurrency_hazard", "prefers_sub_replicas", "waves_message",
           "warn_waves"]

log = logging.getLogger("sparkdl")

_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                 nn.ConvTranspose3d, nn.MultiheadAttention)


def prefers_sub_replicas(model: nn.Module) -> bool:
    """Whether ``model`` is of a kind that computes faster on sub-replicas than with intra-op
    threads: it has convolutions or attention (torch's modules, or a module whose class name
    says ``Conv`` or ``Attention``, as Hugging Face's do). Measured on 2 cores
    (``bench/task_aggregation.py``): LeNet-5 and a small transformer encoder 6-27% faster on
    sub-replicas; MLPs 17-40% slower; an embedding-bag recommender even."""
    return any(isinstance(m, _CONVOLUTIONS) or "Conv" in type(m).__name__
               or "Attention" in type(m).__name__ for m in model.modules())


def concurrency_hazard(model: nn.Module, criterion: Any, training_step: Any,
                       inputs: Sequence[torch.Tensor], target: torch.Tensor) -> str | None:
    """Why copies of ``model`` cannot train concurrently and stay exact: a training forward and
    backward on ``inputs`` (a copy of the model, in the modes the tasks train in) that draws
    from torch's random generator (one per process, shared by the threads) or changes a buffer.
    None when it does neither."""
    probe = copy.deepcopy(model)
    set_training_modes(probe, training_modes(probe))
    before = {name: b.detach().clone() for name, b in probe.named_buffers()}
    with private_torch_rng(seed=0):
        state = torch.get_rng_state()
        if training_step is not None:
            loss = step_loss_terms(training_step, probe, inputs, target)[0]
        else:
            loss = criterion(probe(*inputs), target)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.sum().backward()
        drew = not torch.equal(state, torch.get_rng_state())
    if drew:
        return "draws random numbers in training (dropout or the like)"
    changed = [name for name, b in probe.named_buffers()
               if name in before and not torch.equal(b.detach(), before[name])]
    if changed:
        return f"changes the buffer {changed[0]!r} in training (BatchNorm statistics or the like)"
    return None


def choose_sub_replicas(requested: int | None, task_cores: int, gpus: bool,
                        hazard: Callable[[], str | None], augments: bool = False,
                        prefers: bool = True) -> tuple[int, str]:
    """``(sub-replicas per task, how the tasks use their cores)`` (see the module docstring).
    ``hazard()`` is :func:`concurrency_hazard` on the run's model; ``gpus``: the cluster
    schedules GPUs to the tasks; ``augments``: the run has a ``train_transform``; ``prefers``:
    :func:`prefers_sub_replicas` of the model."""
    threads = f"one replica per task with {task_cores} intra-op thread" + \
        ("s" if task_cores > 1 else "")
    if requested == 1 or (requested is None and (task_cores <= 1 or gpus)):
        return 1, threads
    if requested is None and not prefers:
        return 1, f"{threads} (faster than sub-replicas for models without convolutions or " \
            "attention; subReplicas / sub_replicas asks for them)"
    if augments:
        if requested is None:
            return 1, f"{threads} (train_transform draws per task, not per sub-replica)"
        raise InvalidArgumentError(
            f"sub_replicas={requested} cannot be combined with train_transform (its generator "
            "is one per task): use sub_replicas=1 (subReplicas=1).")
    reason = hazard()
    if reason is not None:
        if requested is None:
            return 1, f"{threads} (the model {reason}, which sub-replicas in threads cannot do)"
        raise InvalidArgumentError(
            f"sub_replicas={requested}: the model {reason}, which sub-replicas running at once "
            "cannot do exactly. Use sub_replicas=1 (subReplicas=1): one replica per task with "
            "the task's cores as intra-op threads.")
    count = task_cores if requested is None else requested
    per = max(1, task_cores // count)
    return count, (f"{count} sub-replicas per task in threads ({per} intra-op thread"
                   f"{'s' if per > 1 else ''} each), summed in the task")


def waves_message(partitions: int, slots: int) -> str | None:
    """What to say when an iteration's ``partitions`` tasks exceed the cluster's ``slots``
    (the tasks it runs at once): the waves each iteration runs and how to match them; None
    when they fit in one wave.

    Example: ``waves_message(8, 2)`` says 4 waves and how to train on 2 partitions."""
    if partitions <= slots:
        return None
    waves = math.ceil(partitions / slots)
    return (f"the training data has {partitions} partitions and the cluster runs {slots} "
            f"tasks at once (its task slots: executor cores // spark.task.cpus), so each "
            f"iteration runs in {waves} waves of tasks, the later ones waiting for the earlier. "
            f"To train in one wave, repartition the training RDD to {slots} "
            f"(rdd.repartition({slots})) or, on the estimators, set numTrainWorkers={slots} "
            "(0, the default, is the task slots)")


def warn_waves(data: Any, runner: Any, device: str) -> str | None:
    """Log (WARNING) :func:`waves_message` for training ``data`` on ``runner`` (a classic
    SparkContext's runner and an RDD; nothing for the others), from the RDD's partitions and
    the settings, with no Spark job. Returns the message, or None."""
    sc = getattr(runner, "spark_context", None)
    if sc is None or not hasattr(data, "getNumPartitions"):
        return None
    message = waves_message(int(data.getNumPartitions()), task_slots(sc, device))
    if message is not None:
        log.warning("%s", message)
    return message
