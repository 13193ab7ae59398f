"""Does a long run grow in memory? Driver and Python-worker RSS over 1,000 iterations.

    python bench/memory_growth.py [--iterations 1000] [--workload W1]

Trains one reference workload (bench/compare_runners.py's definitions) for --iterations on
local[2] and prints the driver's and the largest worker's resident set every tenth of the run,
from sparkdl's own per-iteration summary, then the growth from the first tenth to the end.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compare_runners import WORKLOADS, synthetic_data, train_sparkdl  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--workload", default="W1", choices=list(WORKLOADS))
    args = p.parse_args()
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl bench: memory growth", "local[2]", {"spark.ui.enabled": "false"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    x, y = synthetic_data()
    recs = train_sparkdl(WORKLOADS[args.workload], x, y, sc, args.iterations).summary.iterations
    step = max(1, len(recs) // 10)
    print(f"{args.workload}, {len(recs)} iterations on local[2]\n")
    print("| iteration | driver RSS MiB | worker RSS MiB | iteration ms |")
    print("|---:|---:|---:|---:|")
    for r in recs[step - 1::step]:
        print(f"| {r.iteration} | {r.driver_rss_bytes / 2**20:,.1f} | "
              f"{r.worker_rss_bytes / 2**20:,.1f} | {1000 * r.wall_s:.1f} |")
    first, last = recs[step - 1], recs[-1]
    print(f"\ngrowth from iteration {first.iteration} to {last.iteration}: driver "
          f"{(last.driver_rss_bytes - first.driver_rss_bytes) / 2**20:+.1f} MiB, worker "
          f"{(last.worker_rss_bytes - first.worker_rss_bytes) / 2**20:+.1f} MiB")
    spark.stop()


if __name__ == "__main__":
    main()
