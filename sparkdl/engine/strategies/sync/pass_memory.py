"""What a pass of fits holds in memory, against the Spark settings that bound it (driver side,
before any job).

A pass (:mod:`sparkdl.engine.fit_set`) holds every one of its fits at once:

* in each task's Python worker: each fit's replica (weights and gradients) and the pass's vector,
  every fit's gradients one after another, once as numpy values and once pickled for Spark; for
  a fit in local rounds also its optimizer's state, twice (the optimizer's own, and the
  partition's state read from or written beside its shard: it never reaches the driver);
* at the driver, each iteration: the task results of that vector (one per partition on the
  driver AllReduce path, the reduced blocks once on the shuffle path), through the driver's JVM;
* at the driver, in Python: every fit's weights, gradient vector and optimizer state.

These settings bound that, and :func:`plan_passes` splits a set of fits into passes that stay
within each:

``spark.driver.maxResultSize`` (default 1g; 0: no limit)
    Spark aborts a job whose task results exceed it. Hard: a fit that alone exceeds it is
    refused before any job, with an error naming the setting.
``spark.executor.pyspark.memory`` (unset by default: no limit)
    Spark divides it by ``spark.executor.cores`` and gives each Python worker that share as its
    address-space limit; a worker above it fails with a MemoryError. Hard, as above.
``spark.driver.memory`` (default 1g)
    The task results pass through the driver's heap. 128 MiB of results per iteration ran a
    1 GiB heap out of memory (bench/allreduce_crossover.py), so a job hands the driver at most
    an eighth of the heap. Hard, as above.

``spark.sparkdl.maxRecordBytes`` (default 32m) with ``spark.executor.memory`` (default 1g)
    and ``spark.driver.memory``
    The most bytes of a vector one JVM record carries: a frame a task's Python hands its
    executor's JVM, a block of the AllReduce (one reducer's sum: its task's result), a
    broadcast piece of the weights (seeded by the driver's block manager, assembled by each
    executor's). A JVM holds a record about :data:`RECORD_COPIES` times while it passes (read,
    serialized as a task's result, sent), for each task it runs at once
    (``spark.executor.cores / spark.task.cpus``; the cores of ``local-cluster[n,c,m]``), so an
    executor's heap beyond Spark's :data:`RESERVED_HEAP` must hold that many, and the driver's
    those of a piece it seeds: what the model's size never changes. A record budget
    that a heap cannot hold is refused before any job, naming the settings (a local master's
    tasks run in the driver's JVM and pass their vectors as files: only the driver is
    checked there). On the driver path a task's result is its whole vector: a fit whose
    vector the executors' heaps cannot hold so is refused, naming ``spark.executor.memory``.

On the shuffle path a large vector's sums reach the driver in several jobs of at most
:func:`~sparkdl.transport.allreduce.driver_job_bytes` each (an eighth of the heap, half of
``spark.driver.maxResultSize``), so neither setting bounds the model there; on the driver path
every partition's whole vector comes in one job, and a fit above either bound is refused (use
the shuffle path).

Under Spark Connect (:mod:`sparkdl.runners.connect_dataframe`) none of these apply; there a
job's function carries each fit's model and weights unless they travel as files through
``exchangeDir`` (:mod:`sparkdl.executor.exchange`), and :func:`closure_budget` keeps a pass's
function within twice what one fit may carry (soft: one fit's own limit is checked before any
work).

The bytes are counted from the fits' parameters, buffers and optimizers; activations depend on
the data and batch and are not counted (they are the same per fit whether fits share a pass or
not, since a task runs its fits one after another). The driver's Python memory for the fits'
weights and optimizer states is reported in the log; no Spark setting bounds it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable, Sequence

import torch

from ....errors import InvalidArgumentError
from ....spark_settings import (CLUSTER_CONF, DRIVER_JOB_BYTES, MAX_RECORD_BYTES, RESERVED_HEAP,
                                driver_job_bytes_setting, is_local_master,
                                max_record_bytes_setting, spark_bytes, storage_pool_bytes)
from ....executor.exchange import CLOSURE_MAX_BYTES, FILE_ABOVE_BYTES
from ....transport.allreduce import (DRIVER_HEAP_SHARE, choose_allreduce, driver_job_bytes,
                                        job_intake, shuffle_blocks)
from ....transport.flat_layout import ParamLayout

__all__ = ["Footprint", "Budget", "footprint", "budgets", "closure_budget", "plan_passes",
           "describe", "block_store_warning", "spark_bytes", "executor_tasks", "RECORD_COPIES", "RESERVED_HEAP"]

log = logging.getLogger("sparkdl")

_MIB = 1 << 20
_RESULT_SLACK = 1.05
"""Pickled task results (and their reports) are a little larger than their raw vectors."""


RECORD_COPIES = 3
"""How many times at least a JVM holds a record's bytes while it passes: a reducer's sum as the
frames read from its Python worker, as the task's serialized result, and as the result's
message (each grown in a buffer that may briefly double); a broadcast piece as its torrent
blocks and as the value they are read back into. The checks refuse only what is known to be
too much: the true peak is higher."""


@dataclasses.dataclass(frozen=True)
class Footprint:
    """One fit's bytes: its weights (parameters and buffers), its gradient vector, and its
    optimizer state (as the optimizer holds it, or as it will once it steps)."""

    weights: int
    vector: int
    optimizer_state: int
    rounds: bool = False      # trained in local rounds: its optimizer runs in the tasks

    def worker_bytes(self) -> int:
        """What the fit adds to a task's Python worker in a pass: its replica's weights and
        gradients, and its part of the pass's vector as numpy values and pickled; in local
        rounds also its optimizer's state twice (the optimizer's own, and the partition's
        state as it is read from and written beside the shard)."""
        return (2 * self.weights + 3 * self.vector +
                (2 * self.optimizer_state if self.rounds else 0))


@dataclasses.dataclass(frozen=True)
class Budget:
    """One bound on a pass: ``bytes`` of ``what``, from the Spark ``setting`` (``value`` as
    configured); ``hard``: Spark fails a job above it (a fit above it alone is refused)."""

    setting: str
    value: str
    bytes: int
    what: str
    hard: bool
    measure: Callable[[Sequence[Footprint]], int] = dataclasses.field(repr=False,
                                                                      compare=False)
    hint: str = ""
    """Another way out than raising the setting, for the error."""

    def needs(self, fits: Sequence[Footprint]) -> int:
        return self.measure(fits)


def _optimizer_state_bytes(optimizer: Any) -> int:
    """The optimizer's state: what it holds now, or, before its first step, the usual slots of
    its kind per parameter (two for kinds it does not know)."""
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    total = 0
    for opt in optimizers:
        if opt is None or not hasattr(opt, "param_groups"):
            continue
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p) if hasattr(opt, "state") else None
                if state:
                    total += sum(v.numel() * v.element_size() for v in state.values()
                                 if isinstance(v, torch.Tensor))
                else:
                    total += _slots(type(opt).__name__, group) * p.numel() * p.element_size()
    return total


def _slots(kind: str, group: dict[str, Any]) -> int:
    if kind == "SGD":
        return int(bool(group.get("momentum", 0)))
    if kind in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "SparseAdam"):
        return 2 + int(bool(group.get("amsgrad", False)))
    if kind == "RMSprop":
        return 1 + int(bool(group.get("momentum", 0))) + int(bool(group.get("centered", False)))
    if kind in ("Adagrad", "ASGD"):
        return 1
    return 2


def footprint(fit: Any, layout: ParamLayout) -> Footprint:
    """``fit``'s (a :class:`sparkdl.DistriOptimizer`) bytes, ``layout``: its model's."""
    vector = layout.size * layout.numpy_dtype.itemsize
    rounds = (getattr(fit, "local_steps", 1) > 1 or
              getattr(fit, "outer_optimizer", None) is not None)
    return Footprint(layout.state_bytes, vector, _optimizer_state_bytes(fit.optimizer),
                     rounds)


def _intake(path: str, num_partitions: int, job_bytes: int | None
            ) -> Callable[[Sequence[Footprint]], int]:
    """The driver's intake of task results per job of a pass of these fits."""
    def measure(fits: Sequence[Footprint]) -> int:
        vector = sum(f.vector for f in fits)
        chosen = (choose_allreduce(vector, num_partitions, job_bytes) if path == "auto"
                  else path)
        intake = job_intake(vector, chosen, num_partitions, None, job_bytes)
        # the driver path's whole pickled vectors; the shuffle's jobs are cut to job_bytes
        return int(_RESULT_SLACK * intake) if chosen == "driver" else intake
    return measure


def _worker(fits: Sequence[Footprint]) -> int:
    return sum(f.worker_bytes() for f in fits)


def executor_tasks(setting: Callable[[str], str | None], master: str) -> int:
    """How many tasks one executor runs at once: ``spark.executor.cores`` (unset: the cores
    of ``local-cluster[n,c,m]``, else 1, the fewest any cluster manager gives) over
    ``spark.task.cpus``; at least 1."""
    cores = setting("spark.executor.cores")
    if not cores:
        cluster = re.fullmatch(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,\s*\d+\s*\]",
                               master.strip())
        cores = cluster.group(1) if cluster else "1"
    return max(1, int(cores) // max(1, int(setting("spark.task.cpus") or "1")))


def _room(heap: int) -> int | None:
    """What a heap of ``heap`` bytes has beyond Spark's reserved memory (None: a heap Spark
    starts only in its testing mode, which the records' checks leave alone)."""
    return heap - RESERVED_HEAP if heap >= 3 * RESERVED_HEAP // 2 else None


def _driver_pieces(record: int) -> Callable[[Sequence[Footprint]], int]:
    """What the driver's JVM holds of a broadcast piece it seeds for a pass of these fits: the
    piece (at most ``record``, at most the pass's weights) about :data:`RECORD_COPIES` times."""
    def measure(fits: Sequence[Footprint]) -> int:
        return RECORD_COPIES * min(record, sum(f.weights for f in fits))
    return measure


def _executor_records(path: str, num_partitions: int, job_bytes: int, record: int, tasks: int
                      ) -> Callable[[Sequence[Footprint]], int]:
    """What an executor's JVM holds at once of a pass of these fits: for each of its ``tasks``
    its largest record about :data:`RECORD_COPIES` times (a driver-path task's result is its
    whole vector; a shuffle block is at most ``record``)."""
    def measure(fits: Sequence[Footprint]) -> int:
        vector = sum(f.vector for f in fits)
        chosen = (choose_allreduce(vector, num_partitions, job_bytes) if path == "auto"
                  else path)
        if chosen == "driver":
            largest = vector
        else:
            # the blocks the record and job budgets need (the whole-waves rounding only
            # makes them smaller; a num_blocks of the user's is never fewer blocks)
            largest = -(-vector // shuffle_blocks(vector, num_partitions, job_bytes, record,
                                                  whole_waves=False))
        largest = max(largest, min(record, max((f.weights for f in fits), default=0)))
        return tasks * RECORD_COPIES * largest
    return measure


def budgets(setting: Callable[[str], str | None], allreduce: str,
            num_partitions: int) -> list[Budget]:
    """The bounds on a pass from Spark's settings (``setting(key)``: the value or None), for
    fits on the ``allreduce`` path over ``num_partitions`` partitions, among them what the
    records of a pass (at most ``spark.sparkdl.maxRecordBytes`` each) ask of the driver's and
    the executors' heaps: :func:`plan_passes` refuses a fit they cannot hold."""
    out: list[Budget] = []
    result = setting("spark.driver.maxResultSize") or "1g"
    heap = setting("spark.driver.memory") or "1g"
    chosen = setting(DRIVER_JOB_BYTES)
    job_bytes = driver_job_bytes(spark_bytes(heap, "m", "spark.driver.memory"),
                                 spark_bytes(result, "b", "spark.driver.maxResultSize"),
                                 driver_job_bytes_setting(chosen))
    intake = _intake(allreduce, num_partitions, job_bytes)
    # what a record budget asks of a heap is measured per pass (a small model's records are
    # small whatever the budget): a fit the heaps cannot hold is refused before any job
    record = max_record_bytes_setting(setting(MAX_RECORD_BYTES))
    driver_room = _room(spark_bytes(heap, "m", "spark.driver.memory"))
    if driver_room is not None:
        out.append(Budget("spark.driver.memory", heap, driver_room,
                          f"broadcast pieces the driver seeds (each at most {MAX_RECORD_BYTES}, "
                          f"held about {RECORD_COPIES} times)",
                          True, _driver_pieces(record), f", or lower {MAX_RECORD_BYTES}"))
    hint = ("" if allreduce != "driver" else
            ", or use allreduce=\"shuffle\" (its sums reach the driver in jobs that stay "
            "within both settings)")
    if spark_bytes(result, "b") > 0:
        out.append(Budget("spark.driver.maxResultSize", result, spark_bytes(result, "b"),
                          "task results per job at the driver", True, intake, hint))
    if chosen:      # the user's share of the heap, refused only above the heap itself
        if job_bytes > spark_bytes(heap):
            raise InvalidArgumentError(
                f"{DRIVER_JOB_BYTES}={chosen} is more than the driver's heap "
                f"(spark.driver.memory={heap}): no job's results could arrive. Lower it or "
                "raise spark.driver.memory; nothing has run yet.")
        out.append(Budget(DRIVER_JOB_BYTES, chosen, job_bytes, "task results per job at the "
                          "driver", True, intake, hint))
    else:
        out.append(Budget("spark.driver.memory", heap, spark_bytes(heap) // DRIVER_HEAP_SHARE,
                          f"task results per job at the driver (1/{DRIVER_HEAP_SHARE} of its "
                          "heap)", True, intake, hint))
    master = setting("spark.master") or ""
    # the executors are the driver's JVM on a local master (their vectors pass as files)
    tasks = None if not master or is_local_master(master) else executor_tasks(setting, master)
    executor = setting("spark.executor.memory") or "1g"
    room = _room(spark_bytes(executor, "m", "spark.executor.memory"))
    if tasks is not None and room is not None:
        out.append(Budget("spark.executor.memory", executor, room,
                          f"records and task results in an executor's JVM ({tasks} task(s) at "
                          f"once, each holding its largest about {RECORD_COPIES} times)", True,
                          _executor_records(allreduce, num_partitions, job_bytes, record, tasks),
                          ", or use allreduce=\"shuffle\" (its tasks' results are blocks of at "
                          f"most {MAX_RECORD_BYTES})" if allreduce == "driver" else
                          f", or lower {MAX_RECORD_BYTES}"))
    python = setting("spark.executor.pyspark.memory")
    if python:
        cores = int(setting("spark.executor.cores") or "1")
        out.append(Budget("spark.executor.pyspark.memory", python, spark_bytes(python) // cores,
                          f"a Python worker's memory (the setting / spark.executor.cores={cores})",
                          True, _worker))
    return out


_FRACTION = "spark.memory.fraction"


def block_store_warning(setting: Callable[[str], str | None], fits: Sequence[Footprint]
                        ) -> str | None:
    """Why a pass of these fits may run a cluster JVM out of heap although every budget holds
    (None: no reason): its weights are larger than the driver's or the executors' block-store
    pool at a ``spark.memory.fraction`` above :data:`~sparkdl.spark_settings.CLUSTER_CONF`'s,
    so their broadcast pieces fill that pool every iteration and the records and task results
    passing through the JVM have the rest of its heap only (Spark's 0.6 ran both JVMs out with
    a 1.1 GiB model on 2g heaps; 0.3 trained it). Local masters pass large values as files.

    Example: ``block_store_warning({"spark.master": "yarn"}.get, [fp])`` for a 1 GiB ``fp``."""
    master = setting("spark.master") or ""
    if not master or is_local_master(master):
        return None
    fraction = float(setting(_FRACTION) or 0.6)
    if fraction <= float(CLUSTER_CONF[_FRACTION]):
        return None
    weights = sum(f.weights for f in fits)
    for key in ("spark.driver.memory", "spark.executor.memory"):
        heap = setting(key) or "1g"
        pool = storage_pool_bytes(spark_bytes(heap, "m", key), fraction)
        if weights > pool:
            return (f"the weights ({weights / _MIB:.0f} MiB) are larger than the block store's "
                    f"pool of a {key}={heap} heap at {_FRACTION}={fraction:g} "
                    f"({pool / _MIB:.0f} MiB): their broadcast pieces fill it every iteration "
                    "and the gradient blocks and task results passing through that JVM have "
                    f"the rest of its heap only. If a JVM runs out of heap, start the session "
                    f"with {_FRACTION}={CLUSTER_CONF[_FRACTION]} (sparkdl.spark_settings."
                    "spark_session sets it on cluster masters)")
    return None


def closure_budget(exchange_dir: str | None) -> Budget:
    """The bound on a Spark Connect pass: the models and weights its jobs' functions carry
    (each fit's model and weights, about twice its weights, except those that travel as files
    through ``exchange_dir``) within twice what one fit may carry without a directory."""
    def inline(fits: Sequence[Footprint]) -> int:
        return sum(2 * f.weights for f in fits
                   if not (exchange_dir and f.weights > FILE_ABOVE_BYTES))
    return Budget("exchangeDir", exchange_dir or "unset", 2 * CLOSURE_MAX_BYTES,
                  "models and weights in a Spark Connect job's function", False, inline)


def _refusal(k: int, fit: Footprint, budget: Budget) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"fit {k} cannot train within {budget.setting}={budget.value}: it needs about "
        f"{budget.needs([fit]) / _MIB:.1f} MiB of {budget.what}, and the setting allows "
        f"{budget.bytes / _MIB:.1f} MiB ({fit.weights / _MIB:.1f} MiB of weights, a "
        f"{fit.vector / _MIB:.1f} MiB gradient vector). Raise {budget.setting}"
        f"{budget.hint} or train a smaller model; nothing has run yet.")


def plan_passes(group: Sequence[int], fits: Sequence[Footprint],
                limits: Sequence[Budget]) -> list[list[int]]:
    """``group`` (fits' positions, ``fits``: their footprints, in that order) in passes within
    ``limits``: in order, each pass as long as every budget holds. A fit that alone exceeds a
    hard budget is refused (:class:`sparkdl.errors.InvalidArgumentError` naming the setting);
    one that alone exceeds a soft budget trains alone, with a warning."""
    for k, fp in zip(group, fits):
        for budget in limits:
            if budget.needs([fp]) > budget.bytes:
                if budget.hard:
                    raise _refusal(k, fp, budget)
                log.warning("fit %d alone needs about %.1f MiB of %s, above the %.1f MiB "
                            "%s=%s allows: it trains in a pass of its own", k,
                            budget.needs([fp]) / _MIB, budget.what, budget.bytes / _MIB,
                            budget.setting, budget.value)
    passes: list[list[int]] = []
    current: list[int] = []
    current_fp: list[Footprint] = []
    for k, fp in zip(group, fits):
        trial = current_fp + [fp]
        over = [b for b in limits if b.needs(trial) > b.bytes]
        if current and over:
            log.info("fit %d starts another pass: %d fits already need %.1f MiB of %s (%s=%s "
                     "allows %.1f MiB)", k, len(current), over[0].needs(trial) / _MIB,
                     over[0].what, over[0].setting, over[0].value, over[0].bytes / _MIB)
            passes.append(current)
            current, current_fp = [], []
        current.append(k)
        current_fp.append(fp)
    passes.append(current)
    return passes


def describe(fits: Sequence[Footprint]) -> str:
    """A pass's memory in words, for the log."""
    return (f"{sum(f.worker_bytes() for f in fits) / _MIB:.1f} MiB of replicas and vectors per "
            f"task, {sum(f.weights + f.vector + f.optimizer_state for f in fits) / _MIB:.1f} "
            "MiB of weights, gradients and optimizer state at the driver")
