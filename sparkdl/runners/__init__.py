"""Implementations of the loop's seam, :class:`sparkdl.runners.interface.IterationRunner`.

* :mod:`sparkdl.runners.spark_rdd`: RDD jobs on a classic SparkContext (the default), with the
  executor-held data of :mod:`sparkdl.runners.cached_rdd`;
* :mod:`sparkdl.runners.in_process`: the same tasks as plain calls in this process, for fast
  tests and as the bitwise reference (training data given as :class:`LocalPartitions`);
* :mod:`sparkdl.runners.connect_dataframe`: DataFrame operations only, for Spark Connect
  sessions (the estimators hand it a :class:`~sparkdl.data.dataframe_arrays.DataFrameBlocks`).

Example::

    from sparkdl.runners import LocalPartitions
    opt = DistriOptimizer(net, LocalPartitions([part0_records, part1_records]), ...)
    opt.optimize()            # no Spark involved; bitwise equal to the same partitions on Spark
"""

from __future__ import annotations

from typing import Any

from ..data.dataframe_arrays import DataFrameBlocks
from .connect_dataframe import ConnectDataFrameRunner
from .in_process import InProcessRunner, LocalPartitions
from .spark_rdd import SparkRddRunner

__all__ = ["LocalPartitions", "InProcessRunner", "SparkRddRunner", "ConnectDataFrameRunner",
           "runner_for"]


def runner_for(data: Any, exchange_dir: str | None = None) -> Any:
    """The runner for training data of this kind: an RDD runs on its SparkContext,
    :class:`LocalPartitions` in this process, DataFrame blocks as DataFrame jobs (large weights
    through ``exchange_dir``)."""
    if isinstance(data, LocalPartitions):
        return InProcessRunner()
    if isinstance(data, DataFrameBlocks):
        return ConnectDataFrameRunner(data.spark, exchange_dir)
    return SparkRddRunner(data.context)
