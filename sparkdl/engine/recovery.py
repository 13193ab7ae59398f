"""Running a job so that lost executor-held data costs time, never the run (driver side).

A job can fail because data the runner keeps on the executors was lost with an executor (the
runner recognises such failures), or it can finish with partitions whose shard was not where
their task ran. Either way the data is rebuilt from its source and the job runs again; since
every job is deterministic, the result is the one an undisturbed job would have given.

Example::

    result = run_with_recovery(runner, train, lambda: runner.gradients(train, step, w),
                               lambda r: r.missing_partitions, "iteration 7")
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

from ..errors import SparkdlError
from ..runners.interface import DataHandle, IterationRunner

__all__ = ["MAX_REBUILDS", "run_with_recovery"]

log = logging.getLogger("sparkdl")

MAX_REBUILDS = 3
"""Rebuilds of one data set allowed for one job before the run fails."""

T = TypeVar("T")


def run_with_recovery(runner: IterationRunner, data: DataHandle, job: Callable[[], T],
                      missing: Callable[[T], list[int]], what: str) -> T:
    """``job()``, rebuilt and re-run while it lost ``data`` (at most :data:`MAX_REBUILDS`
    times); ``missing(result)`` lists the partitions that found no data where they ran."""
    for attempt in range(MAX_REBUILDS + 1):
        try:
            result = job()
        except Exception as exc:
            reason = runner.lost_data_reason(exc)
            if reason is None or attempt == MAX_REBUILDS:
                raise
            runner.rebuild(data, f"the job of {what} lost executor-held data ({reason})")
            continue
        lost = missing(result)
        if not lost:
            return result
        runner.rebuild(data, f"partitions {lost} found no shard on the executor that ran them")
    raise SparkdlError(f"{what}: the {data.name} shards could not be kept on the executors "
                       f"after {MAX_REBUILDS} rebuilds")
