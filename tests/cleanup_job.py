"""Five fits of a ~20 MB model on a local-cluster (own process), with the best-effort cleanup job
switched off, then a probe of what every Python worker still holds.

    python cleanup_job.py OUT.json [--no-eviction]

``--no-eviction``: tasks carry no live-run snapshot either, so nothing evicts finished runs (the
probe must then see them: the test's check can fail).
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
    out, no_eviction = sys.argv[1], "--no-eviction" in sys.argv
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
    if no_eviction:
        spark_rdd.live_runs = held_data.live_runs = lambda: None
    spark = spark_builder("local-cluster[2,1,1024]").getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2300)).astype(np.float32)
    y = rng.integers(0, 2300, 40)
    for fit in range(5):
        keys.append([])
        torch.manual_seed(fit)
        net = torch.nn.Linear(2300, 2300)                    # 21 MB of float32 weights
        DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [10, 10, 10, 10]),
                        torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                        batch_size=16, end_trigger=MaxIteration(2), seed=fit,
                        progress_bar=False).optimize()
    held = sc.parallelize(range(16), 16).mapPartitions(probe).collect()
    with open(out, "w") as f:
        json.dump({"fits": keys, "held": held}, f)
    spark.stop()


if __name__ == "__main__":
    main()
