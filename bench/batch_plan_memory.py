"""Driver cost of the batch plan: the per-partition plan against the owner-per-sample order it
replaced, side by side in one run (construction plus one epoch of ``shares``; peak memory by
tracemalloc, which sees numpy's allocations).

    python bench/batch_plan_memory.py            # 60M samples / 200 partitions, 1e8 / 1000
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from sparkdl.data.batch_plan import BatchPlan


def owner_per_sample(sizes: np.ndarray, batch: int) -> None:
    """What the plan did before: an owner per sample of the epoch, then bincounts."""
    keys = np.concatenate([(np.arange(m, dtype=np.float64) + 0.5) / m for m in sizes if m])
    owners = np.concatenate([np.full(m, i, np.int32) for i, m in enumerate(sizes) if m])
    owner = owners[np.argsort(keys, kind="stable")]
    del keys, owners
    for lo in range(0, len(owner), batch):
        np.bincount(owner[lo:lo + batch], minlength=len(sizes))


def partition_plan(sizes: np.ndarray, batch: int) -> None:
    plan = BatchPlan(sizes, batch, seed=0)
    for step in range(plan.iterations_per_epoch):
        plan.shares(0, step)


def measure(fn, sizes: np.ndarray, batch: int) -> tuple[float, float]:
    tracemalloc.start()
    t0 = time.perf_counter()
    fn(sizes, batch)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20


def sizes_of(total: int, partitions: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 200_000, partitions)
    sizes = (sizes * (total / sizes.sum())).astype(np.int64)
    sizes[0] += total - int(sizes.sum())
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--skip-old-above", type=int, default=60_000_000,
                        help="do not run the old plan above this many samples (memory)")
    args = parser.parse_args()
    print(f"{'samples':>12} {'partitions':>10} {'plan':>26} {'seconds':>8} {'peak MiB':>9}")
    for total, partitions in ((60_000_000, 200), (100_000_000, 1000)):
        sizes = sizes_of(total, partitions)
        runs = [("per-partition (now)", partition_plan)]
        if total <= args.skip_old_above:
            runs.append(("owner per sample (before)", owner_per_sample))
        for name, fn in runs:
            seconds, peak = measure(fn, sizes, args.batch)
            print(f"{total:>12,} {partitions:>10} {name:>26} {seconds:>8.2f} {peak:>9.1f}")


if __name__ == "__main__":
    main()
