"""What resuming local rounds after a killed driver costs: tests/cluster_job.py on local[2]
(rounds of 4 with the Nesterov outer step, 12 iterations, checkpoints at the rounds' ends), run
once without a fault, then run, SIGKILLed after its first checkpoint and run again (the second
run resumes from the checkpoint; its first round rebuilds every partition's state by replaying
the rounds since the last durable copy inside the tasks). Prints each run's wall time, the
iteration it resumed from and whether the resumed weights equal the clean run's bitwise.

    python bench/round_resume_cost.py
    python bench/round_resume_cost.py --hidden 20000 --iterations 24
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--hidden", type=int, default=8, help="SmallNet's hidden width")
    args = p.parse_args()
    sys.path.insert(0, TESTS)
    from models import kill_driver_after_first_checkpoint

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), TESTS]))
    os.environ.update(env)
    job = os.path.join(TESTS, "cluster_job.py")
    with tempfile.TemporaryDirectory() as tmp:
        def cmd(name: str) -> list[str]:
            return [sys.executable, job, "local[2]", os.path.join(tmp, f"{name}.pt"),
                    "--checkpoint", os.path.join(tmp, f"{name}-ckpt"), "--iterations",
                    str(args.iterations), "--hidden", str(args.hidden), "--local-steps", "4",
                    "--outer", "nesterov"]

        t0 = time.perf_counter()
        clean = subprocess.run(cmd("clean"), capture_output=True, text=True, env=env)
        clean_s = time.perf_counter() - t0
        assert clean.returncode == 0, clean.stderr[-3000:]
        t0 = time.perf_counter()
        kill_driver_after_first_checkpoint(cmd("killed"), os.path.join(tmp, "killed-ckpt"))
        killed_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        second = subprocess.run(cmd("killed"), capture_output=True, text=True, env=env)
        resumed_s = time.perf_counter() - t0
        assert second.returncode == 0, second.stderr[-3000:]
        found = re.search(r"resuming from checkpoint \S*checkpoint-(\d+)\.pt", second.stderr)
        equal = all(torch.equal(a, b) for a, b in zip(
            torch.load(os.path.join(tmp, "clean.pt"), weights_only=True).values(),
            torch.load(os.path.join(tmp, "killed.pt"), weights_only=True).values()))
    print(f"SmallNet(hidden {args.hidden}), {args.iterations} iterations in rounds of 4, "
          "local[2], each run a driver process of its own")
    print(f"| clean run | killed after its first checkpoint | resumed run (from iteration "
          f"{int(found.group(1)) if found else '?'}) | resumed equals clean bitwise |")
    print("|---:|---:|---:|---|")
    print(f"| {clean_s:.1f} s | {killed_s:.1f} s | {resumed_s:.1f} s | {equal} |")


if __name__ == "__main__":
    main()
