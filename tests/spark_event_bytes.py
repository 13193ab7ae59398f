"""What the driver received and sent per Spark job, from Spark's own event log: the jobs'
task result sizes (``Task Metrics / Result Size`` of every task end) and the broadcast pieces
the driver's block manager stored before each job (``spark.eventLog.logBlockUpdates.enabled``:
each ``broadcast_<id>_piece<k>`` block on executor ``driver``, counted once when stored; a
piece leaves the driver at least once, executors fetch the others' copies too).

The event log needs ``spark.eventLog.enabled=true``, ``spark.eventLog.dir=<dir>``,
``spark.eventLog.compress=false`` and ``spark.eventLog.logBlockUpdates.enabled=true``
(:func:`EVENT_LOG_SETTINGS`); it is complete once the SparkContext stopped.

Example::

    jobs = job_bytes(event_log_file(log_dir))
    per_round = [j.result_bytes + j.broadcast_bytes for j in jobs if j.group == "fit-1"]
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

__all__ = ["EVENT_LOG_SETTINGS", "JobBytes", "event_log_file", "job_bytes"]

_PIECE = re.compile(r"^broadcast_\d+_piece\d+$")


def EVENT_LOG_SETTINGS(directory: str) -> dict[str, str]:  # noqa: N802 - a table of settings
    """The Spark settings the event log this module reads needs."""
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": directory,
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.logBlockUpdates.enabled": "true"}


@dataclass
class JobBytes:
    """One job: its id, job group, call site, and the bytes the driver received (its tasks'
    results) and sent (broadcast pieces stored on the driver since the previous job)."""

    job: int
    group: str
    call_site: str
    result_bytes: int = 0
    broadcast_bytes: int = 0

    @property
    def total(self) -> int:
        return self.result_bytes + self.broadcast_bytes


def event_log_file(directory: str) -> str:
    """The one application's event log under ``directory``."""
    names = [n for n in os.listdir(directory) if not n.startswith(".")]
    if len(names) != 1:
        raise AssertionError(f"expected one event log in {directory}, found {names}")
    return os.path.join(directory, names[0])


def _lines(path: str):
    """The event log's lines: one file, or a rolling log's directory of ``events_<n>_*``."""
    if not os.path.isdir(path):
        with open(path) as f:
            yield from f
        return
    names = sorted((n for n in os.listdir(path) if n.startswith("events_")),
                   key=lambda n: int(n.split("_")[1]))
    for name in names:
        with open(os.path.join(path, name)) as f:
            yield from f


def job_bytes(path: str) -> list[JobBytes]:
    """Every job of the event log at ``path`` (a file or a rolling log's directory), in
    order."""
    jobs: dict[int, JobBytes] = {}
    stage_job: dict[int, int] = {}
    pending = 0
    seen: set[str] = set()
    for line in _lines(path):
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerBlockUpdated":
            info = event["Block Updated Info"]
            block = info.get("Block ID", "")
            if (_PIECE.match(block) and block not in seen and
                    info["Block Manager ID"]["Executor ID"] == "driver" and
                    int(info["Storage Level"].get("Replication", 0)) > 0):   # 0: removed
                seen.add(block)
                pending += int(info.get("Memory Size", 0)) + int(info.get("Disk Size", 0))
        elif kind == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            job = JobBytes(int(event["Job ID"]), props.get("spark.jobGroup.id", ""),
                           props.get("callSite.short", ""), broadcast_bytes=pending)
            pending = 0
            jobs[job.job] = job
            for stage in event.get("Stage IDs", []):
                stage_job[int(stage)] = job.job
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            job_id = stage_job.get(int(event["Stage ID"]))
            if job_id is not None:
                jobs[job_id].result_bytes += int(metrics.get("Result Size", 0))
    return [jobs[k] for k in sorted(jobs)]
