"""The loop's jobs as DataFrame operations only: the runner for Spark Connect sessions, which
have no SparkContext, RDDs, broadcasts or py4j (the second :class:`IterationRunner`).

* Data: the build job (``mapInArrow`` over the input rows) turns each partition into a shard in
  the Python workers (:mod:`sparkdl.executor.shard_store`) and yields one summary row per
  partition; that result is ``localCheckpoint`` -ed, so later jobs read the tiny index rows from
  the executors that built the shards, and locality sends task ``i`` there. Workers keep shards
  best effort only: a task that finds none reports it, and a fill job over exactly those
  partitions' input rows builds them where it runs and computes the same step
  (:class:`ConnectData.fill`). Nothing depends on a worker keeping anything.
* The model and the weights travel inside the tasks' functions while small and through files
  in ``exchange_dir`` when large (:mod:`sparkdl.executor.exchange`).
* One iteration: the gradient map over the index rows, then either the client sums the
  partitions' vectors in partition order (driver path), or ``repartitionById(K, "k")`` brings
  block ``k`` of every task to partition ``k``, which sums them in partition order (shuffle
  path): the block-sharded AllReduce of :mod:`sparkdl.transport.allreduce` in DataFrame form.
  Either way the sum is bitwise the classic runner's. An iteration in which some task found no
  shard is finished on the client with the filled partitions' vectors, no other task computing
  again: the driver path sums every partition's vector again; on the shuffle path each
  reducer's sum stopped before the first missing partition and sent the later partitions'
  blocks, so the client goes on adding in partition order.
* Several fits over the same data (a pass: :mod:`sparkdl.engine.fit_set`) run one job per
  iteration for all of them: each task computes every fit's vector on its shard
  (:class:`~sparkdl.executor.tasks.PassGradientTask`), the vectors one after another are summed
  as one, each fit's part exactly as its own job would, and each fit's weights travel as their
  own payload.
* Every build and fill plans the DataFrame again. A source whose split follows the cluster's
  cores (a local relation, ``range``, small files) can split differently once executors join or
  leave; the rebuilt shard then fails the content check with a message saying what to do
  (``localCheckpoint()`` the DataFrame or write it to Parquet before ``fit``).

Example::

    runner = ConnectDataFrameRunner(spark, exchange_dir=None)
    train = runner.load(frame_blocks(df, ...), "training", "float32")
    runner.start(ReplicaSpec(net, loss, "mean"), ParamLayout(net), RunnerOptions(), train)
    result = runner.gradients(train, step, weights)
    runner.close()
"""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidArgumentError
from ..executor.arrow_tasks import (BUILD_SCHEMA, RESULT_SCHEMA, ArrowBuildTask, ArrowCleanup,
                                    ArrowEvaluate, ArrowFill, PayloadValue, join_chunks,
                                    read_rows)
from ..executor.replicas import ReplicaSpec
from ..executor.shard_store import ShardSummary
from ..executor.step import StepSpec
from ..executor.tasks import EvaluationTask, GradientTask, PassGradientTask
from ..metrics import ValidationMetric
from ..spark_settings import SHARD_REPLICAS
from ..storage.arrow_files import ArrowFiles
from ..transport.allreduce import AllReduceResult
from ..transport.codecs import make_codec, make_pass_codec
from ..executor.live_runs import live_runs, new_key, release_key
from ..executor.exchange import Exchange, Payload, check_exchange
from ..transport.flat_layout import ParamLayout
from ..transport.pass_results import split_pass_result
from ..transport.weight_refresh import StateVersion
from .cached_rdd import lost_data_reason, memory_kill_reason, shard_place
from .held_data import HeldData, complete_misses, not_found
from .connect_summing import Summing, complete, driver_job, shuffle_job
from .interface import GradientRunner, PartitionMetrics, RunnerOptions

__all__ = ["ConnectData", "ConnectDataFrameRunner"]

log = logging.getLogger(__name__)


def _results(table: Any) -> dict[int, tuple[ShardSummary | None, Any]]:
    """Rows of RESULT_SCHEMA by partition: (summary or None, the unpickled result)."""
    pieces: dict[int, list[tuple[int, Any]]] = {}
    summaries: dict[int, Any] = {}
    for row in read_rows(table):
        p = int(row["partition"])
        pieces.setdefault(p, []).append((row["seq"], row["payload"]))
        if row["summary"] is not None:
            summaries[p] = pickle.loads(row["summary"])
    return {p: (summaries.get(p), pickle.loads(join_chunks(c) or b""))
            for p, c in pieces.items()}


class ConnectData(HeldData):
    """A DataFrame's rows held as shards in the Python workers, with the checkpointed index
    rows that carry locality (DataFrame jobs; everything else is
    :class:`~sparkdl.runners.held_data.HeldData`'s; see the module docstring).

    Args:
        blocks: :class:`~sparkdl.data.dataframe_arrays.DataFrameBlocks` (never modified).
        float_dtype, name, place, ragged: as for :class:`~sparkdl.runners.held_data.HeldData`.
    """

    source = "the DataFrame"
    rebuild_hint = ("Under Spark Connect every rebuild plans the DataFrame again: a source "
                    "split by the cluster's cores (a local relation, range, small files) splits "
                    "differently once executors join or leave, so localCheckpoint() the "
                    "DataFrame or write it to Parquet before fit.")

    def __init__(self, blocks: Any, float_dtype: str, name: str, place: str = "disk",
                 ragged: tuple[int, ...] = ()) -> None:
        super().__init__(float_dtype, name, place, ragged)
        self.blocks = blocks
        self.index: Any = None

    @property
    def num_partitions(self) -> int:
        return int(self.blocks.num_partitions)

    def _build(self) -> list[ShardSummary]:
        built = self.blocks.selected.mapInArrow(
            ArrowBuildTask(self.blocks.converter, self.builder), BUILD_SCHEMA)
        self.index = built.localCheckpoint()
        return [pickle.loads(r["summary"]) for r in read_rows(self.index.toArrow())]

    def _fill(self, partitions: list[int], task: Any, resources: Any
              ) -> dict[int, tuple[ShardSummary, Any]]:
        from pyspark.sql import functions as F

        source = self.blocks.selected.where(F.spark_partition_id().isin(partitions))
        fill = ArrowFill(self.blocks.converter, self.builder, task, frozenset(partitions))
        rows = _results(source.mapInArrow(fill, RESULT_SCHEMA).toArrow())
        assert all(summary is not None for summary, _ in rows.values())
        return rows       # type: ignore[return-value]


@dataclass
class _ConnectFit:
    """One fit of the runner: its replicas' key, its shipped model and how its vectors sum."""

    run_key: str
    spec: Payload
    summing: Summing


class ConnectDataFrameRunner(GradientRunner):
    """DataFrame jobs on a Spark Connect (or classic) session (see the module docstring).

    Args:
        spark: the session.
        exchange_dir: where large weights travel (required for models above
            :data:`~sparkdl.executor.exchange.CLOSURE_MAX_BYTES`).
    """

    spark_context = None

    def __init__(self, spark: Any, exchange_dir: str | None = None) -> None:
        self.spark = spark
        self.files = ArrowFiles()
        self.run_key = new_key("run")
        self.exchange_dir = exchange_dir
        self._exchange = Exchange(exchange_dir, self.run_key)
        self._held: list[ConnectData] = []
        self._options = RunnerOptions()
        self._fits: dict[int, _ConnectFit] = {}
        self._default: int | None = None
        self._passes: dict[tuple[int, ...], Summing] = {}
        self._closed: list[str] = []

    def _conf(self, key: str, default: str = "") -> str:
        try:
            return str(self.spark.conf.get(key, default) or default)
        except Exception:
            return default

    def task_cores(self) -> int:
        try:
            return max(1, int(float(self._conf("spark.task.cpus", "1"))))
        except ValueError:
            return 1

    def schedules_gpus(self) -> bool:
        try:
            return float(self._conf("spark.executor.resource.gpu.amount", "0")) > 0
        except ValueError:
            return False

    def check_device(self, device: str) -> None:
        if device != "cuda":
            return
        try:
            gpus = float(self._conf("spark.task.resource.gpu.amount", "0"))
        except ValueError:
            gpus = 0.0
        if gpus <= 0:
            raise InvalidArgumentError(
                "device='cuda' under Spark Connect needs GPUs scheduled to every task: set "
                "spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount on the "
                "cluster (a Connect session cannot ask for them per stage); device='auto' uses a "
                "GPU where a task has one and the CPU otherwise.")

    def load(self, data: Any, name: str, float_dtype: str,
             ragged: tuple[int, ...] = ()) -> ConnectData:
        try:
            encryption = str(self.spark.conf.get("spark.io.encryption.enabled", "false"))
        except Exception as exc:     # fail closed: an unknown setting keeps shards off disk
            log.warning("cannot read spark.io.encryption.enabled (%s); keeping shards in the "
                        "Python workers' memory, as with encryption on", exc)
            encryption = "true"
        place = shard_place({"spark.io.encryption.enabled": encryption})
        if name == "training":
            try:
                replicas = str(self.spark.conf.get(SHARD_REPLICAS, "1"))
            except Exception:       # a server that does not say: nothing asked for
                replicas = "1"
            if replicas.strip() not in ("", "1"):
                log.warning("%s=%s is not applied under Spark Connect (its DataFrame jobs "
                            "cannot send a task to a chosen executor): each training shard is "
                            "held once and Spark places the tasks", SHARD_REPLICAS, replicas)
        held = ConnectData(data, float_dtype, name, place, ragged)
        self._held.append(held)
        held.build()
        return held

    def start(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
              train: ConnectData) -> str:
        fit, how = self.add_fit(spec, layout, options, train)
        if self._default is None:
            self._default = fit
        return how

    def add_fit(self, spec: ReplicaSpec, layout: ParamLayout, options: RunnerOptions,
                train: ConnectData) -> tuple[int, str]:
        """Ship one more fit's model (its own replicas' key); returns its number and how its
        vectors are summed alone. The fits of one runner share ``options`` (the first fit's
        are kept) but ``compression``, which is each fit's own."""
        from pyspark import cloudpickle

        check_exchange(layout.state_bytes, self.exchange_dir)
        if not self._fits:
            self._options = options
        codec = make_codec(options.compression, layout.numpy_dtype, layout.num_param_values)
        summing = Summing.of(layout.size, layout.numpy_dtype, options, train.num_partitions,
                              codec)
        number = max(self._fits, default=-1) + 1
        self._fits[number] = _ConnectFit(
            new_key("run"), self._exchange.ship(cloudpickle.dumps(spec), "model"), summing)
        how = ("the client sums the vectors" if summing.driver else
               f"repartitionById all-reduce in {len(summing.bounds) - 1} blocks")
        via = ("through files in the exchange directory" if self._exchange.by_file(layout.state_bytes)
               else "inside the tasks' functions")
        return number, (f"DataFrame jobs (Spark Connect), {how} of {layout.size} values, "
                        f"weights {via}" + (f" (gradients in {options.compression})"
                                            if options.compression else ""))

    def gradients(self, data: ConnectData, step: StepSpec, version: StateVersion
                  ) -> AllReduceResult:
        assert self._default is not None
        return self.gradients_together(data, [(self._default, step, version)])[0]

    def gradients_together(self, data: ConnectData,
                           entries: Sequence[tuple[int, StepSpec, StateVersion]]
                           ) -> list[AllReduceResult]:
        """One job for the iteration of every fit in ``entries`` (``(fit, step, weights)``):
        each fit's vector summed in partition order, exactly as its own job would (one fit
        alone: its own job; :mod:`sparkdl.engine.fit_set`)."""
        assert entries
        t0 = time.perf_counter()
        live = live_runs()
        shipped, tasks = [], []
        try:
            for number, step, version in entries:
                fit = self._fits[number]
                weights = version.state    # whole: Connect has no broadcasts to keep deltas in
                shipped.append(self._exchange.ship(np.ascontiguousarray(weights).tobytes(),
                                                   f"weights-{number}-{step.iteration}"))
                tasks.append(GradientTask(fit.run_key, data.data_key, step,
                                          PayloadValue(fit.spec),
                                          PayloadValue(shipped[-1], "array", weights.dtype.str),
                                          live=live))
            broadcast_s = time.perf_counter() - t0
            fits = [self._fits[number] for number, _, _ in entries]
            sizes = [fit.summing.size for fit in fits]
            if len(entries) == 1:
                task: Any = tasks[0]
                s = fits[0].summing
            else:
                task = PassGradientTask(data.data_key, tasks, sizes, fits[0].summing.dtype.str,
                                        live=live)
                s = self._pass_summing([number for number, _, _ in entries], sizes, data)
            result = (driver_job(data, task, s) if s.driver
                      else shuffle_job(data, task, s))
            result = complete_misses(result, lambda missing: data.fill(missing, task),
                                     lambda r, filled: complete(r, filled, s),
                                     data.num_partitions)
        finally:
            for payload in shipped:
                self._exchange.discard(payload)
        result.broadcast_s = broadcast_s
        return [result] if len(entries) == 1 else split_pass_result(result, sizes)

    def _pass_summing(self, numbers: list[int], sizes: list[int], data: ConnectData
                      ) -> Summing:
        """How these fits' vectors, one after another, are summed (kept while the set of fits
        stays the same), each fit's part through its own codec."""
        key = tuple(numbers)
        if key not in self._passes:
            dtype = self._fits[numbers[0]].summing.dtype
            codec = make_pass_codec([self._fits[n].summing.codec for n in numbers], sizes,
                                    dtype)
            self._passes = {key: Summing.of(sum(sizes), dtype, self._options,
                                             data.num_partitions, codec)}
        return self._passes[key]

    def evaluate(self, data: ConnectData, weights: np.ndarray,
                 metrics: Sequence[ValidationMetric], batch_size: int, fit: int | None = None
                 ) -> list[PartitionMetrics]:
        one = self._fits[self._default if fit is None else fit]
        payload = self._exchange.ship(np.ascontiguousarray(weights).tobytes(), "weights-eval")
        try:
            task = EvaluationTask(one.run_key, data.data_key, PayloadValue(one.spec),
                                  PayloadValue(payload, "array", weights.dtype.str), list(metrics),
                                  batch_size, self._options.device, self._options.precision,
                                  live=live_runs())
            rows = {p: result for p, (_, result) in _results(data.index.mapInArrow(
                ArrowEvaluate(task), RESULT_SCHEMA).toArrow()).items()}
            missing = [p for p, row in rows.items() if not_found(row, data)]
            if missing:
                rows.update(data.fill(missing, task))
        finally:
            self._exchange.discard(payload)
        return [rows[p] for p in sorted(rows)]

    def lost_data_reason(self, exc: BaseException) -> str | None:
        return lost_data_reason(exc)

    def memory_kill_reason(self, exc: BaseException) -> str | None:
        return memory_kill_reason(exc)

    def driver_failure(self, exc: BaseException) -> str | None:
        return None       # the Spark Connect server's driver: its errors name it themselves

    def rebuild(self, data: ConnectData, reason: str) -> None:
        data.rebuild(reason)

    def close_fit(self, fit: int) -> None:
        """Release one fit's replicas (its data stays with the runner; the workers' cleanup
        job runs once, in :meth:`close`)."""
        one = self._fits.pop(fit, None)
        if one is None:
            return
        self._passes = {}
        self._exchange.discard(one.spec)
        release_key(one.run_key)      # the next task in a worker evicts its replicas
        self._closed.append(one.run_key)

    def close(self) -> None:
        keys = ([self.run_key] + [one.run_key for one in self._fits.values()] + self._closed
                + [d.data_key for d in self._held])
        for key in keys:     # later tasks of any run evict what the cleanup job misses
            release_key(key)
        try:
            width = max(4, 2 * max((d.num_partitions for d in self._held), default=2))
            self.spark.range(0, width, 1, width).mapInArrow(ArrowCleanup(keys),
                                                            "one long").collect()
        except Exception as exc:   # cleanup must never hide the training result
            log.debug("cleanup of %s in the Python workers failed: %s", keys, exc)
        self._exchange.close()
        self._held = []
        self._fits, self._passes, self._closed = {}, {}, []
