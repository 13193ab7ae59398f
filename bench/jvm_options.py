"""The JVM's own options against sparkdl's iteration time, cold and warm (issue 21: the cold-JVM
cost of a fresh ``spark-submit``).

    python bench/jvm_options.py                                   # W2, 3 rounds
    python bench/jvm_options.py --workload W3 --iterations 60 --rounds 2

On a machine with few cores the Spark JVM (the driver, and in local mode the executor too) shares
them with the Python workers that compute the gradients; while it compiles its hot code (HotSpot's
C2 compiler thread) and collects garbage with parallel threads, the tasks run slower. Each run is
a fresh Python process and JVM (what a fresh ``spark-submit`` sees) training one workload of
``bench/compare_runners.py`` with sparkdl on ``local[2]`` for ``--iterations`` iterations; the
option sets run interleaved, round by round. Reported per option set (medians over rounds of
each run's median): the iteration and slowest-task milliseconds over the iterations the suite's
short runs time (cold: iterations 8-31 of W2) and over the run's last 50 (warm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

OPTION_SETS = {
    "default": "",
    "C1 only": "-XX:TieredStopAtLevel=1",
    "ParallelGC": "-XX:+UseParallelGC",
    "C1 only + ParallelGC": "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC",
}


def child(workload: str, iterations: int, java_options: str) -> None:
    """One fresh session: train ``workload`` and print its per-iteration times as JSON."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import compare_runners as cr
    from sparkdl.spark_settings import spark_session

    conf = {"spark.ui.enabled": "false", "spark.driver.memory": "3g"}
    if java_options:
        conf["spark.driver.extraJavaOptions"] = java_options
    spark = spark_session("sparkdl bench: JVM options", "local[2]", conf)
    spark.sparkContext.setLogLevel("ERROR")
    x, y = cr.synthetic_data()
    opt = cr.train_sparkdl(cr.WORKLOADS[workload], x, y, spark.sparkContext, iterations)
    print(json.dumps([[r.wall_s, r.compute_s] for r in opt.summary.iterations]), flush=True)
    spark.stop()


def median_ms(rows: list[list[float]], column: int) -> float:
    return 1000 * statistics.median(r[column] for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W2", choices=["W1", "W2", "W3"])
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--options", nargs="+", default=list(OPTION_SETS), choices=list(OPTION_SETS))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:      # the options travel in the environment (they start with "-")
        child(args.workload, args.iterations, os.environ["SPARKDL_BENCH_JAVA_OPTIONS"])
        return
    from compare_runners import WORKLOADS

    w = WORKLOADS[args.workload]
    cold = slice(w.warmup, w.warmup + w.timed)     # what the suite's short run times
    runs: dict[str, list[list[list[float]]]] = {name: [] for name in args.options}
    for r in range(args.rounds):
        for name in args.options:
            out = subprocess.run([sys.executable, __file__, "--child", "--workload",
                                  args.workload, "--iterations", str(args.iterations)],
                                 capture_output=True, text=True, check=True,
                                 env=dict(os.environ,
                                          SPARKDL_BENCH_JAVA_OPTIONS=OPTION_SETS[name]))
            rows = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(rows)
            print(f"round {r + 1} {name:22s} cold {median_ms(rows[cold], 0):7.1f} ms  warm "
                  f"{median_ms(rows[-50:], 0):7.1f} ms", file=sys.stderr, flush=True)
    print(f"\n{args.workload}, sparkdl on local[2], a fresh process per run, {args.iterations} "
          f"iterations, {args.rounds} rounds interleaved; medians over rounds of each run's "
          f"median (ms). Cold: iterations {cold.start}-{cold.stop - 1}; warm: the last 50.\n")
    print("| JVM options | cold iteration | cold slowest task | warm iteration | "
          "warm slowest task | cold / default | warm / default |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    for name in args.options:
        fig = {key: statistics.median(median_ms(rows[window], col) for rows in runs[name])
               for key, window, col in (("ci", cold, 0), ("ct", cold, 1),
                                        ("wi", slice(-50, None), 0),
                                        ("wt", slice(-50, None), 1))}
        base = base or fig
        print(f"| {name}: `{OPTION_SETS[name] or '(none)'}` | {fig['ci']:.1f} | {fig['ct']:.1f} "
              f"| {fig['wi']:.1f} | {fig['wt']:.1f} | {fig['ci'] / base['ci']:.2f} | "
              f"{fig['wi'] / base['wi']:.2f} |")


if __name__ == "__main__":
    main()
