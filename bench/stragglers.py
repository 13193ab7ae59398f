"""What one slow executor costs, with and without Spark's speculation, in one run.

A standalone cluster of two one-core workers on two loopback hosts (127.0.0.1, 127.0.0.2),
the small training job of the tests (6 iterations of 4 partitions), run three ways: no slow
executor; worker1's training tasks 1.5 s slower; the same with ``spark.speculation=true``
(settings in tests/test_stragglers.py). Reports the training wall time, the speculative copies
Spark started, the tasks that ran away from their shard (filled there) and whether the weights
are bitwise those of the run without a slow executor::

    python bench/stragglers.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

importlib.import_module("conftest")   # executors import tests/; loopback only
from models import bitwise_equal  # noqa: E402
from test_stragglers import copies_started, run_with_slow_executor, train_seconds  # noqa: E402

CASES = {"no slow executor": (False, False), "slow executor": (False, True),
         "slow executor, speculation": (True, True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    rows: dict[str, list[tuple[float, int, int, bool]]] = {name: [] for name in CASES}
    reference = None
    for _ in range(args.rounds):
        for name, (speculation, slow) in CASES.items():      # interleaved
            tmp = Path(tempfile.mkdtemp(prefix="sparkdl-stragglers-"))
            model, stdout, _ = run_with_slow_executor(tmp, speculation, slow)
            if reference is None:
                reference = model
            misses = int(re.search(r"placement_misses=(\d+)", stdout).group(1))
            rows[name].append((train_seconds(stdout), copies_started(tmp), misses,
                               bitwise_equal(model, reference)))
    print("| run | training s (median) | speculative copies | tasks away from their shard "
          "| weights bitwise the clean run's |")
    print("|---|---:|---:|---:|---|")
    for name, results in rows.items():
        print(f"| {name} | {statistics.median(r[0] for r in results):.1f} | "
              f"{sum(r[1] for r in results)} | {sum(r[2] for r in results)} | "
              f"{all(r[3] for r in results)} |")


if __name__ == "__main__":
    main()
