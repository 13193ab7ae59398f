"""The driver's bytes per local round with Adam inside, at P = 2, 4, 8, 16 partitions, from
Spark's own metrics (the event log: every task's result size and the broadcast pieces the
driver stored; tests/spark_event_bytes.py).

    python bench/round_driver_bytes.py                               # this tree
    python bench/round_driver_bytes.py --sparkdl /tmp/old-tree       # another tree's sparkdl
    python bench/round_driver_bytes.py --hidden 20000 --partitions 2,4,8,16 \\
        --master 'local-cluster[2,1,1024]' --conf spark.driver.maxResultSize=1g

One driver process (tests/round_bytes_job.py) trains an MLP 6 -> hidden -> 3 with Adam in
rounds of 2 iterations (4 rounds) at each partition count; a round's bytes are its jobs' task
results (received) and the broadcast pieces stored before them (sent), over the rounds after
the first (which ships the fit's bundle). Printed as a markdown table beside the weights' and
the partitions' Adam states' sizes. ``--allreduce shuffle`` by default: ``auto`` sums vectors
at the driver while P x the vector stays under 64 MiB (faster there, bench/RESULTS.md), so its
driver bytes grow with P up to that bound by design.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--hidden", type=int, default=20000)
    p.add_argument("--partitions", default="2,4,8,16")
    p.add_argument("--sparkdl", help="the tree whose sparkdl trains (default: this one)")
    p.add_argument("--allreduce", default="shuffle", help="shuffle (default), auto or driver")
    p.add_argument("--conf", action="append", default=[], help="KEY=VALUE, a Spark setting")
    args = p.parse_args()
    tree = os.path.abspath(args.sparkdl or os.path.dirname(HERE))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([tree, TESTS]))
    out = tempfile.mkdtemp(prefix="sparkdl-round-bytes-")
    cmd = [sys.executable, os.path.join(TESTS, "round_bytes_job.py"), args.master, out,
           "--hidden", str(args.hidden), "--partitions", args.partitions,
           "--optimizers", "adam", "--allreduce", args.allreduce, *[a for c in args.conf for a in ("--conf", c)]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        print(f"| {args.partitions} | the fit failed: see above |")
        sys.exit(1)
    with open(os.path.join(out, "bytes.json")) as f:
        fits = json.load(f)
    print(f"sparkdl from {tree}, {args.master}, MLP 6-{args.hidden}-3, Adam, rounds of 2, "
          f"allreduce={args.allreduce}")
    print("| P | weights MB | P x Adam state MB | received MB/round | sent MB/round | "
          "total MB/round | total / (2 x weights) |")
    print("|---|---|---|---|---|---|---|")
    sys.path.insert(0, TESTS)
    from round_bytes_job import mean_round_bytes

    for key, fit in fits.items():
        received, sent = mean_round_bytes(fit)
        weights = fit["weights_bytes"]
        mb = 1e6
        print(f"| {fit['partitions']} | {weights / mb:.2f} | "
              f"{fit['partitions'] * 2 * weights / mb:.1f} | {received / mb:.2f} | "
              f"{sent / mb:.2f} | {(received + sent) / mb:.2f} | "
              f"{(received + sent) / (2 * weights):.3f} |")


if __name__ == "__main__":
    main()
