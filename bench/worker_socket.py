"""The JVM-to-Python-worker socket on older pyspark: loopback TCP (3.4/3.5, where
``spark.python.unix.domain.socket.enabled`` does not exist) against the Unix socket of 4.1+.

    python bench/worker_socket.py --older .venv-spark35/bin/python
    python bench/worker_socket.py --older .venv-spark35/bin/python --workloads W1 --rounds 3

Each run is a fresh process and session on ``local[2]`` (sparkdl's recommended settings)
training one workload of ``bench/compare_runners.py`` for ``--iterations`` iterations. Variants,
interleaved round by round:

- ``newest, Unix socket``: this interpreter's pyspark (4.1+) as sparkdl runs it;
- ``newest, TCP``: the same with ``spark.python.unix.domain.socket.enabled=false``, the socket
  alone changed;
- ``older, TCP``: ``--older``'s interpreter (a venv with pyspark 3.4 or 3.5 and the same torch),
  where TCP is the only way.

Reported per variant (medians over rounds of each run's median, ms): the iteration and the
slowest task's compute over iterations 8-31 (cold) and the last 50 (warm), and the
iteration's time outside the tasks' compute (launch, transfer, reduce).
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


def child(workload: str, iterations: int, unix_socket: str) -> None:
    """One fresh session: train ``workload``, print pyspark's version and the per-iteration
    times as JSON."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import pyspark

    import compare_runners as cr
    from sparkdl.spark_settings import spark_session

    conf = {"spark.ui.enabled": "false", "spark.driver.memory": "3g"}
    if unix_socket:
        conf["spark.python.unix.domain.socket.enabled"] = unix_socket
    spark = spark_session("sparkdl bench: worker socket", "local[2]", conf)
    spark.sparkContext.setLogLevel("ERROR")
    x, y = cr.synthetic_data()
    opt = cr.train_sparkdl(cr.WORKLOADS[workload], x, y, spark.sparkContext, iterations)
    rows = [[r.wall_s, r.compute_s] for r in opt.summary.iterations]
    print(json.dumps({"pyspark": pyspark.__version__, "rows": rows}), flush=True)
    spark.stop()


def median_ms(rows: list[list[float]], column: int | None) -> float:
    """Median ms of a column (None: wall minus compute)."""
    values = [r[0] - r[1] if column is None else r[column] for r in rows]
    return 1000 * statistics.median(values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--older", required=True, help="python of a venv with pyspark 3.4 or 3.5")
    p.add_argument("--workloads", nargs="+", default=["W1", "W2"], choices=["W1", "W2"])
    p.add_argument("--iterations", type=int, default=120)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.workload, args.iterations, os.environ.get("SPARKDL_BENCH_UNIX_SOCKET", ""))
        return
    variants = {"newest, Unix socket": (sys.executable, "true"),
                "newest, TCP": (sys.executable, "false"),
                "older, TCP": (os.path.abspath(args.older), "")}
    cold, warm = slice(8, 32), slice(-50, None)
    for workload in args.workloads:
        runs: dict[str, list[list[list[float]]]] = {name: [] for name in variants}
        versions: dict[str, str] = {}
        for r in range(args.rounds):
            for name, (python, unix_socket) in variants.items():
                out = subprocess.run([python, __file__, "--older", args.older, "--child",
                                      "--workload", workload, "--iterations",
                                      str(args.iterations)],
                                     capture_output=True, text=True, check=True,
                                     env=dict(os.environ, PYSPARK_PYTHON=python,
                                              SPARKDL_BENCH_UNIX_SOCKET=unix_socket))
                result = json.loads(out.stdout.strip().splitlines()[-1])
                versions[name] = result["pyspark"]
                runs[name].append(result["rows"])
                print(f"{workload} round {r + 1} {name:20s} (pyspark {result['pyspark']}) warm "
                      f"{median_ms(result['rows'][warm], 0):7.1f} ms", file=sys.stderr,
                      flush=True)
        print(f"\n{workload}, sparkdl on local[2], a fresh process per run, {args.iterations} "
              f"iterations, {args.rounds} rounds interleaved; medians over rounds of each run's "
              "median (ms). Cold: iterations 8-31; warm: the last 50.\n")
        print("| variant | pyspark | cold iteration | warm iteration | warm slowest task | "
              "warm outside compute | warm / newest Unix |")
        print("|---|---|---:|---:|---:|---:|---:|")
        base = None
        for name in variants:
            fig = [statistics.median(median_ms(rows[window], col) for rows in runs[name])
                   for window, col in ((cold, 0), (warm, 0), (warm, 1), (warm, None))]
            base = base or fig[1]
            print(f"| {name} | {versions[name]} | {fig[0]:.1f} | {fig[1]:.1f} | {fig[2]:.1f} | "
                  f"{fig[3]:.1f} | {fig[1] / base:.2f} |")


if __name__ == "__main__":
    main()
