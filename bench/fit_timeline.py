"""A fit's Spark jobs on a timeline: where a short fit's time goes, job by job.

    python bench/fit_timeline.py                       # T1: a rounds fit, warm (after a first)
    python bench/fit_timeline.py --workload T2 --runners sync rounds

Runs ``bench/time_to_accuracy.py``'s runners one after the other on one ``local[2]`` session
with Spark's event log on, then prints, for the last fit, each job from the fit's call: when it
was submitted and ended, what started it, and each task's launch, end, deserialization and run
time (milliseconds) from the log. The gaps between jobs are the driver's own work.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time
from typing import Any

import time_to_accuracy as tta


def read_events(directory: str) -> list[dict[str, Any]]:
    events = []
    for path in glob.glob(os.path.join(directory, "**"), recursive=True):
        if os.path.isfile(path) and "appstatus" not in os.path.basename(path):
            with open(path) as f:
                events.extend(json.loads(line) for line in f)
    return events


def timeline(events: list[dict[str, Any]], since: float) -> list[str]:
    jobs: dict[int, dict[str, Any]] = {}
    tasks: list[dict[str, Any]] = []
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            jobs[e["Job ID"]] = {"start": e["Submission Time"] / 1000, "stages": e["Stage IDs"],
                                 "site": e.get("Properties", {}).get("callSite.short", "")}
        elif kind == "SparkListenerJobEnd":
            jobs[e["Job ID"]]["end"] = e["Completion Time"] / 1000
        elif kind == "SparkListenerTaskEnd":
            info, metrics = e["Task Info"], e.get("Task Metrics", {})
            tasks.append({"stage": e["Stage ID"], "launch": info["Launch Time"] / 1000,
                          "finish": info["Finish Time"] / 1000,
                          "deser": metrics.get("Executor Deserialize Time"),
                          "run": metrics.get("Executor Run Time")})
    lines = []
    for number, job in sorted(jobs.items()):
        if job["start"] < since:
            continue
        end = job.get("end", job["start"])
        spans = " ".join(f"[{t['launch'] - since:.3f}-{t['finish'] - since:.3f} deser {t['deser']} "
                         f"run {t['run']}]" for t in tasks if t["stage"] in job["stages"])
        lines.append(f"job {number}: {job['start'] - since:6.3f}-{end - since:6.3f} s "
                     f"({(end - job['start']) * 1000:4.0f} ms) {job['site'][:48]:48s} {spans}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="T1", choices=sorted(tta.WORKLOADS))
    parser.add_argument("--runners", nargs="+", default=["rounds", "rounds"],
                        choices=["sync", "rounds"], help="fits in this order; the last is shown")
    args = parser.parse_args()
    log_dir = tempfile.mkdtemp(prefix="sparkdl-timeline-")
    spark = tta.spark_session({
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": log_dir,
        "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"})
    w = tta.WORKLOADS[args.workload]
    data = tta.load(args.workload, spark)
    since = 0.0
    for runner in args.runners:
        since = time.time()
        run = tta.RUNNERS[runner](w, data, 0, w.target, False, sc=spark.sparkContext)
        print(f"{args.workload} {runner}: first evaluation at the target after "
              f"{run.time_to(w.target):.2f} s (fit's call to its first iteration "
              f"{run.fixed_s:.2f} s)")
    spark.stop()
    time.sleep(1)       # the event log is complete once the context has stopped
    print("\nthe last fit's jobs (seconds from its runner's call: the data's parallelize and a "
          "count first):")
    for line in timeline(read_events(log_dir), since):
        print(line)


if __name__ == "__main__":
    main()
