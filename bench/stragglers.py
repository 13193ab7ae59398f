"""What one slow executor costs, with and without speculation and shard replicas, in one run.

A standalone cluster of two workers on two loopback hosts (127.0.0.1, 127.0.0.2; Spark never
starts a speculative copy on the host of the running attempt), ``--cores`` cores each, the small
training job of the tests (4 partitions) for ``--iterations`` iterations, run six ways: with and
without worker1's training tasks ``--seconds`` slower, with and without
``spark.speculation=true`` (settings in tests/test_stragglers.py) and with one or two holders
per shard (``spark.sparkdl.shardReplicas``). Reports the training wall time and its ratio to the
clean run, the replica job's time, the speculative copies Spark started, the tasks that ran
away from their shard (filled there), the times an executor was avoided, and whether the
weights are bitwise those of the clean run. ``--sweep`` runs the slow executor with replicas
under several speculation settings instead::

    python bench/stragglers.py [--iterations 30] [--seconds 1.0] [--cores 2] [--sweep]
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

importlib.import_module("conftest")   # executors import tests/; loopback only
from models import bitwise_equal  # noqa: E402
from test_stragglers import (SPECULATION, copies_started, run_with_slow_executor,  # noqa: E402
                             train_seconds)

CASES = {"no slow executor": (False, False, 1),
         "no slow executor, replicas": (False, False, 2),
         "slow executor": (False, True, 1),
         "slow executor, speculation": (True, True, 1),
         "slow executor, replicas": (False, True, 2),
         "slow executor, speculation, replicas": (True, True, 2)}

_BASE = {k: v for k, v in SPECULATION.items() if k != "spark.locality.wait"}
SWEEP = {
    "interval 50ms, multiplier 1.5, quantile 0.5 (recommended)": SPECULATION,
    "the same, spark.locality.wait 3s (Spark's default)":
        {**_BASE},
    "multiplier 3": {**SPECULATION, "spark.speculation.multiplier": "3"},
    "quantile 0.75": {**SPECULATION, "spark.speculation.quantile": "0.75"},
    "interval 1s": {**SPECULATION, "spark.speculation.interval": "1s"},
    "Spark's defaults (spark.speculation=true only)": {"spark.speculation": "true"},
}


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--only", nargs="*", help="run only these cases (by name); the first is "
                   "the one the others are compared with")
    args = p.parse_args()
    runs = ({name: (True, True, 2, settings) for name, settings in SWEEP.items()}
            if args.sweep else
            {name: (*case, None) for name, case in CASES.items()})
    if args.sweep:
        runs = {"no slow executor": (False, False, 1, None), **runs}
    if args.only:
        runs = {name: runs[name] for name in args.only}
    rows, reference, clean = [], None, None
    for name, (speculation, slow, replicas, settings) in runs.items():
        tmp = Path(tempfile.mkdtemp(prefix="sparkdl-stragglers-"))
        model, stdout, stderr = run_with_slow_executor(
            tmp, speculation, slow, replicas=replicas, iterations=args.iterations,
            seconds=args.seconds, cores=args.cores, settings=settings)
        if reference is None:
            reference = model
        seconds = train_seconds(stdout)
        clean = clean or seconds
        rows.append((name, seconds, seconds / clean,
                     number(r"replica shards built in ([0-9.]+) s", stderr),
                     copies_started(tmp), int(number(r"placement_misses=(\d+)", stdout)),
                     int(number(r"executors_avoided=(\d+)", stdout)),
                     bitwise_equal(model, reference)))
        print(f"{name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    print(f"{args.iterations} iterations, worker1's tasks {args.seconds} s slower, two "
          f"workers of {args.cores} cores\n")
    print("| run | training s | x clean | replica job s | speculative copies | tasks away "
          "from their shard | executor avoided | weights bitwise the clean run's |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, seconds, ratio, job, copies, misses, avoided, same in rows:
        print(f"| {name} | {seconds:.2f} | {ratio:.2f} | {job:.2f} | {copies} | {misses} | "
              f"{avoided} | {same} |")


if __name__ == "__main__":
    main()
