"""Local rounds with Adam inside on a 17M-parameter MLP (68 MB of weights, Adam's state 136 MB
per partition), 2 partitions, batches of 64 of 256 rows, rounds of 2 for 4 iterations, on the
masters and driver settings where shipping every partition's state through the driver failed
(issue "Rounds that scale with the cluster"): does each fit train, what it sends and receives
through the driver per round, and its largest difference from the rounds' single-process
definition (tests/rounds_reference.py).

    python bench/rounds_memory_cells.py                      # the three cells, one after another
    python bench/rounds_memory_cells.py --cells local        # one of them

Each cell is one driver process (tests/round_bytes_job.py, Spark's event log on) with the
cell's master and settings; ``allreduce="auto"`` (the default a user gets). Adam's ``eps`` is
1e-3 there, so that float noise near zero gradients cannot flip a step's sign.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
HIDDEN = 1_700_000          # SmallNet(6, HIDDEN, 3): 10 x HIDDEN + 3 parameters
BATCH, ITERATIONS = 64, 4
CELLS = {
    "cluster-1g": ("local-cluster[2,1,1024]", ["spark.driver.memory=1g",
                                               "spark.driver.maxResultSize=64m",
                                               "spark.executor.memory=1g"]),
    "cluster-3g": ("local-cluster[2,1,3072]", ["spark.driver.memory=2g",
                                               "spark.executor.memory=1g"]),
    "local": ("local[2]", ["spark.driver.memory=1g", "spark.driver.maxResultSize=64m"]),
}


def run_cell(name: str, timeout: float) -> str:
    sys.path.insert(0, TESTS)
    import round_bytes_job as job
    from models import max_abs_diff
    from rounds_reference import rounds_reference

    master, conf = CELLS[name]
    out = tempfile.mkdtemp(prefix="sparkdl-rounds-cell-")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), TESTS]))
    cmd = [sys.executable, os.path.join(TESTS, "round_bytes_job.py"), master, out,
           "--hidden", str(HIDDEN), "--partitions", "2", "--optimizers", "adam",
           "--iterations", str(ITERATIONS), "--batch", str(BATCH),
           *[a for c in conf for a in ("--conf", c)]]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"| {master} | {', '.join(conf)} | no result in {timeout:.0f} s | | | |"
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        return f"| {master} | {', '.join(conf)} | failed: {last} | | | |"
    with open(os.path.join(out, "bytes.json")) as f:
        fit = json.load(f)["adam-p2"]
    moved = sum(job.mean_round_bytes(fit))
    expected = rounds_reference(job.initial_model(HIDDEN), job.partition_arrays(2),
                                nn.CrossEntropyLoss(),
                                job.optimizer_for("adam"), BATCH, job.SEED, ITERATIONS,
                                job.LOCAL_STEPS, "average")
    trained = job.initial_model(HIDDEN)
    trained.load_state_dict(torch.load(os.path.join(out, "adam-p2.pt"), weights_only=True))
    diff = max_abs_diff(trained, expected)
    change = max_abs_diff(trained, job.initial_model(HIDDEN))
    return (f"| {master} | {', '.join(conf)} | trains in {seconds:.0f} s | "
            f"{moved / 1e6:.1f} | {diff:.2g} | {change:.2g} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    weights = (10 * HIDDEN + 3) * 4
    print(f"MLP 6-{HIDDEN}-3 ({weights / 1e6:.0f} MB), Adam inside rounds of 2, 2 partitions, "
          f"batch {BATCH}, {ITERATIONS} iterations")
    print("| master | settings | outcome | driver MB per round (after the first) | "
          "largest difference from the definition | largest change from the start |")
    print("|---|---|---|---:|---:|---:|")
    for name in args.cells:
        print(run_cell(name, args.timeout), flush=True)


if __name__ == "__main__":
    main()
