"""What a classic SparkContext schedules to sparkdl's tasks: cores, and GPUs where its executors
have them (a ``local[N]`` master never schedules GPUs).

Example::

    check_gpu_scheduling(sc, "cuda")            # InvalidArgumentError where no GPU is scheduled
    profile = gpu_task_profile(sc, "auto", 1)   # a resource profile asking 1 GPU per task, or None
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import InvalidArgumentError
from ..spark_settings import is_local_master, spark_number

__all__ = ["task_cores", "schedules_gpus", "check_gpu_scheduling", "gpu_task_profile"]

log = logging.getLogger(__name__)

_EXECUTOR_GPUS = "spark.executor.resource.gpu.amount"
_TASK_GPUS = "spark.task.resource.gpu.amount"


def task_cores(sc: Any) -> int:
    """The cores each task gets (``spark.task.cpus``)."""
    return max(1, int(spark_number(sc, "spark.task.cpus") or 1))


def schedules_gpus(sc: Any) -> bool:
    """``sc``'s executors have GPUs that Spark can assign to tasks."""
    return not is_local_master(sc.master) and spark_number(sc, _EXECUTOR_GPUS) > 0


def check_gpu_scheduling(sc: Any, device: str) -> None:
    """Refuse ``device='cuda'`` where the cluster schedules no GPU to the tasks."""
    if device != "cuda" or schedules_gpus(sc):
        return
    raise InvalidArgumentError(
        "device='cuda' needs GPUs scheduled to the tasks, and this cluster schedules "
        f"none (master {sc.master}): set {_EXECUTOR_GPUS} (with "
        "spark.executor.resource.gpu.discoveryScript or your cluster manager's GPU "
        f"settings) and optionally {_TASK_GPUS}; local[N] masters never "
        "schedule GPUs (use local-cluster, standalone, YARN or Kubernetes). "
        "device='auto' uses a GPU where there is one and the CPU otherwise.")


def gpu_task_profile(sc: Any, device: str, cores: int) -> Any:
    """A task resource profile asking for one GPU per task, when executors have GPUs that
    tasks do not ask for by default (so only sparkdl's stages hold them); else None."""
    if device == "cpu" or not schedules_gpus(sc) or spark_number(sc, _TASK_GPUS) > 0:
        return None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    requests = TaskResourceRequests().cpus(cores).resource("gpu", 1.0)
    log.info("the gradient and validation stages ask for 1 GPU per task through a task "
             "resource profile (%s is not set)", _TASK_GPUS)
    return ResourceProfileBuilder().require(requests).build
