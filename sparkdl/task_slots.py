"""How many tasks a Spark cluster runs at once (its task slots), in Spark's default resource
profile: what the estimators cut their training data into when ``numTrainWorkers`` is 0, and
what the engine compares a training RDD's partitions with (more partitions than slots: every
iteration runs in waves).

Each executor runs ``executor cores // spark.task.cpus`` tasks at once, fewer where tasks ask
for GPUs: ``executor GPUs / GPUs per task`` (``spark.executor.resource.gpu.amount`` and
``spark.task.resource.gpu.amount``; with the executors' GPUs set and the tasks' not, sparkdl's
stages ask one GPU per task unless the device is ``"cpu"``:
:func:`sparkdl.runners.task_resources.gpu_task_profile`). The executors and their cores come
from the master where it names them, else from the running application:

* ``local[N]`` (and ``local[N,F]``): ``N // spark.task.cpus``; ``local[*]``: the driver JVM's
  processors; ``local``: one.
* ``local-cluster[n,c,m]``: ``n * (c // spark.task.cpus)``.
* standalone, YARN, Kubernetes: the executors registered now (the driver aside), with
  ``spark.executor.cores`` (unset: 1 on YARN and Kubernetes; on standalone an executor takes
  its worker's cores, and the slots are the registered cores, ``sc.defaultParallelism``, over
  ``spark.task.cpus``). With dynamic allocation the executors may not be up yet: the count is
  the larger of those registered and those Spark starts with (``initialExecutors``,
  ``minExecutors``, ``spark.executor.instances``), never ``maxExecutors``, which a shared
  cluster may never grant. With no executor known, ``sc.defaultParallelism //
  spark.task.cpus``.
* Spark Connect (no SparkContext): the session's default parallelism
  (:func:`sparkdl.data.dataframe_partitions.default_parallelism`) over ``spark.task.cpus``
  where the session lets it be read.

Always at least one.

Example::

    task_slots(spark)      # 16 on 16 executors of 4 cores with spark.task.cpus=4
    slots_of("local-cluster[2,4,1024]", task_cpus=2)     # 4
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from .spark_settings import is_local_master, spark_setting

__all__ = ["task_slots", "cluster_slots", "counted_executors", "slots_of"]

_LOCAL = re.compile(r"local\[(\d+|\*)(?:,\s*\d+)?\]")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")


def _gpu_slots(executor_gpus: float, task_gpus: float) -> int | None:
    """The tasks one executor's GPUs run at once; None where tasks ask for no GPU."""
    if executor_gpus <= 0 or task_gpus <= 0:
        return None
    # a fraction such as 0.25 is four tasks per GPU; the epsilon absorbs 1 / 0.1 = 9.99..
    return math.floor(executor_gpus / task_gpus + 1e-9)


def slots_of(master: str, task_cpus: int = 1, *, local_cores: int = 1, executors: int = 0,
             executor_cores: int = 0, total_cores: int = 0, executor_gpus: float = 0.0,
             task_gpus: float = 0.0) -> int:
    """The task slots of a cluster on ``master`` (module docstring), from what is known of it:
    ``local_cores`` (the processors ``local[*]`` uses), the ``executors`` and the cores of
    each (``executor_cores``, 0 when unknown; then ``total_cores``, all the executors' cores
    together), the GPUs of each executor and of each task. At least 1.

    Example::

        slots_of("local[8]", task_cpus=2)                                    # 4
        slots_of("yarn", 4, executors=16, executor_cores=4)                  # 16
        slots_of("spark://h:7077", 1, executors=2, executor_cores=8,
                 executor_gpus=2, task_gpus=0.5)                             # 8
    """
    task_cpus = max(1, int(task_cpus))
    master = master.strip()
    if master == "local":
        return 1
    local = _LOCAL.fullmatch(master)
    if local:
        cores = local_cores if local.group(1) == "*" else int(local.group(1))
        return max(1, cores // task_cpus)      # local masters never schedule GPUs
    cluster = _LOCAL_CLUSTER.fullmatch(master)
    if cluster:
        executors, executor_cores = int(cluster.group(1)), int(cluster.group(2))
    gpu_slots = _gpu_slots(executor_gpus, task_gpus)
    if executors > 0 and executor_cores > 0:
        per = executor_cores // task_cpus
        return max(1, executors * (per if gpu_slots is None else min(per, gpu_slots)))
    slots = total_cores // task_cpus
    if executors > 0 and gpu_slots is not None:
        slots = min(slots, executors * gpu_slots)
    return max(1, slots)


def _number(setting: Callable[[str], str], key: str) -> float:
    try:
        return float(setting(key) or 0)
    except ValueError:
        return 0.0


def counted_executors(registered: int, setting: Callable[[str], str]) -> int:
    """The executors whose slots count (module docstring): the ``registered`` ones (the driver
    aside), or, before any registered, ``spark.executor.instances``; with dynamic allocation
    at least the number Spark starts with. ``setting(key)``: the value, or "".

    Example: ``counted_executors(0, {"spark.executor.instances": "4"}.get)``  # 4"""
    started = int(_number(setting, "spark.executor.instances"))
    if (setting("spark.dynamicAllocation.enabled") or "").strip().lower() == "true":
        return max(registered, started,
                   int(_number(setting, "spark.dynamicAllocation.initialExecutors")),
                   int(_number(setting, "spark.dynamicAllocation.minExecutors")))
    return registered if registered > 0 else started


def cluster_slots(master: str, setting: Callable[[str], str], registered: int = 0,
                  local_cores: int = 1, default_parallelism: int = 0,
                  device: str = "auto") -> int:
    """:func:`slots_of` from a classic session's settings (``setting(key)``: the value, or
    ""), its ``registered`` executors, the processors of ``local[*]``, its
    ``sc.defaultParallelism`` (the registered cores on standalone, YARN and Kubernetes) and
    the ``device`` sparkdl's stages train on.

    Example::

        cluster_slots("yarn", {"spark.task.cpus": "2", "spark.executor.cores": "4"}.get, 3)  # 6
    """
    task_cpus = max(1, int(_number(setting, "spark.task.cpus") or 1))
    if is_local_master(master):
        return slots_of(master, task_cpus, local_cores=local_cores)
    gpus = _number(setting, "spark.executor.resource.gpu.amount")
    task_gpus = _number(setting, "spark.task.resource.gpu.amount")
    if task_gpus <= 0 and gpus > 0 and device != "cpu":
        task_gpus = 1.0     # sparkdl's stages ask one GPU per task (gpu_task_profile)
    if master.startswith("local-cluster"):
        return slots_of(master, task_cpus, executor_gpus=gpus, task_gpus=task_gpus)
    cores = int(_number(setting, "spark.executor.cores"))
    if cores <= 0 and master.startswith(("yarn", "k8s://")):
        cores = 1                            # their default spark.executor.cores
    return slots_of(master, task_cpus, executors=counted_executors(registered, setting),
                    executor_cores=cores, total_cores=default_parallelism,
                    executor_gpus=gpus, task_gpus=task_gpus)


def _connect_slots(spark: Any) -> int:
    from .data.dataframe_partitions import default_parallelism

    try:
        task_cpus = int(float(spark.conf.get("spark.task.cpus", "1") or 1))
    except Exception:           # a server that does not show its static settings
        task_cpus = 1
    return max(1, default_parallelism(spark) // max(1, task_cpus))


def task_slots(spark: Any, device: str = "auto") -> int:
    """How many tasks the cluster of ``spark`` (a SparkSession, a Spark Connect session or a
    SparkContext) runs at once in Spark's default resource profile, for sparkdl's stages on
    ``device`` ("auto", "cpu" or "cuda"; see the module docstring). No Spark job on a classic
    session (one under Spark Connect, which has no SparkContext).

    Example::

        from sparkdl.task_slots import task_slots
        train = df.repartition(task_slots(spark))     # one wave per iteration
    """
    from pyspark import SparkContext

    from .storage.file_systems import is_connect_session

    if isinstance(spark, SparkContext):
        sc = spark
    elif is_connect_session(spark):
        return _connect_slots(spark)
    else:
        sc = spark.sparkContext
    master = str(sc.master)
    local = is_local_master(master)
    return cluster_slots(
        master, lambda key: spark_setting(sc, key),
        0 if local else int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1,  # less the driver
        int(sc._jvm.java.lang.Runtime.getRuntime().availableProcessors()) if local else 1,
        0 if local else int(sc.defaultParallelism), device)
