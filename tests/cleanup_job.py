"""Fits of a ~20 MB model on a local-cluster (own process), with the best-effort cleanup job
switched off, each group followed by a probe of what every Python worker still holds.

    python cleanup_job.py OUT.json

Two groups of three fits in one session: first as sparkdl runs them, then with tasks that carry
no live-run snapshot, so that nothing evicts finished runs (the probe must then see them: the
test's check can fail).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def probe(_):
    from sparkdl.executor.live_runs import held_keys

    return [held_keys()]


def main() -> None:
    out = sys.argv[1]
    from conftest import spark_builder
    from models import make_rdd
    import sparkdl.runners.held_data as held_data
    import sparkdl.runners.spark_rdd as spark_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.executor import live_runs
    from sparkdl.triggers import MaxIteration

    keys: list[list[str]] = []

    def recording(prefix):
        key = live_runs.new_key(prefix)
        keys[-1].append(key)
        return key

    spark_rdd.new_key = held_data.new_key = recording
    spark_rdd.clean_workers = lambda sc, keys: None          # the cleanup job: off
    spark = spark_builder("local-cluster[2,1,1024]").getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2300)).astype(np.float32)
    y = rng.integers(0, 2300, 40)
    groups = []
    for group, eviction in enumerate((True, False)):
        if not eviction:
            spark_rdd.live_runs = held_data.live_runs = lambda: None
        keys.clear()
        for fit in range(3):
            keys.append([])
            torch.manual_seed(fit)
            net = torch.nn.Linear(2300, 2300)                # 21 MB of float32 weights
            DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [10, 10, 10, 10]),
                            torch.nn.CrossEntropyLoss(),
                            torch.optim.SGD(net.parameters(), lr=0.1), batch_size=16,
                            end_trigger=MaxIteration(2), seed=3 * group + fit,
                            progress_bar=False).optimize()
        held = sc.parallelize(range(16), 16).mapPartitions(probe).collect()
        groups.append({"fits": [list(k) for k in keys], "held": held})
    with open(out, "w") as f:
        json.dump(groups, f)
    spark.stop()


if __name__ == "__main__":
    main()
