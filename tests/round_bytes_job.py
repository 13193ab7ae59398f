"""Local rounds with Adam and with SGD-momentum inside, each at several partition counts, in one
driver process on a master of its own with Spark's event log on (only one SparkContext can
live in a process):

    python round_bytes_job.py MASTER OUT_DIR [--hidden N] [--partitions 2,4] [--optimizers
        adam,sgd-momentum] [--iterations N] [--batch N] [--allreduce auto|shuffle|driver]
        [--conf KEY=VALUE ...]

Each fit (named ``<optimizer>-p<P>``) runs in its own job group and saves its weights as
``OUT_DIR/<name>.pt``; ``OUT_DIR/bytes.json`` holds, per fit, each round job's bytes the
driver received and sent (:mod:`spark_event_bytes`) and the fit's weights and optimizer state
sizes. Used by tests/test_round_states.py and bench/round_driver_bytes.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import SmallNet, classification_data, make_rdd  # noqa: E402
from spark_event_bytes import EVENT_LOG_SETTINGS, event_log_file, job_bytes  # noqa: E402

BATCH, SEED, LOCAL_STEPS = 32, 5, 2
ROWS = 256


def optimizer_for(name: str):
    """The inner optimizer ``name``'s factory (Adam's eps large enough that float noise near
    zero gradients cannot flip a step's sign)."""
    if name == "adam":
        return lambda m: torch.optim.Adam(m.parameters(), lr=0.001, eps=1e-3)
    if name == "sgd-momentum":
        return lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    raise ValueError(name)


def initial_model(hidden: int) -> SmallNet:
    torch.manual_seed(3)
    return SmallNet(6, hidden, 3)


def dataset(partitions: int):
    """The rows and their split into ``partitions`` (as ``make_rdd`` splits them)."""
    x, y = classification_data(ROWS, seed=1)
    return x, y, [ROWS // partitions] * partitions


def partition_arrays(partitions: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each partition's ``(x, y)`` of :func:`dataset`, in partition order (as ``make_rdd``
    splits it; the form ``rounds_reference`` takes)."""
    x, y, sizes = dataset(partitions)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def mean_round_bytes(fit: dict) -> tuple[float, float]:
    """The bytes the driver received and sent per round of ``fit`` (an entry of
    ``bytes.json``), over its rounds after the first (which ships the fit's bundle once)."""
    jobs = [j for j in fit["jobs"] if "all-reduce" in j["call_site"]]
    per = max(1, len(jobs) // fit["rounds"])
    later = jobs[per:]
    rounds = max(1, len(later) // per)
    return (sum(j["received"] for j in later) / rounds,
            sum(j["sent"] for j in later) / rounds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("master")
    p.add_argument("out")
    p.add_argument("--hidden", type=int, default=20000)
    p.add_argument("--partitions", default="2,4")
    p.add_argument("--optimizers", default="adam,sgd-momentum")
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--batch", type=int, default=BATCH, help="the global batch")
    p.add_argument("--allreduce", default="auto", help="DistriOptimizer's allreduce")
    p.add_argument("--conf", action="append", default=[], help="KEY=VALUE, a Spark setting")
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from conftest import spark_builder
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    log_dir = tempfile.mkdtemp(prefix="sparkdl-event-log-")
    builder = spark_builder(args.master).config("spark.executor.memory", "768m")
    for key, value in EVENT_LOG_SETTINGS(log_dir).items():
        builder = builder.config(key, value)
    for setting in args.conf:
        builder = builder.config(*setting.split("=", 1))
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    fits = {}
    for name in args.optimizers.split(","):
        for partitions in [int(v) for v in args.partitions.split(",")]:
            key = f"{name}-p{partitions}"
            x, y, sizes = dataset(partitions)
            net = initial_model(args.hidden)
            make = optimizer_for(name)
            sc.setJobGroup(key, key)
            opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes),
                                  torch.nn.CrossEntropyLoss(), make(net), batch_size=args.batch,
                                  seed=SEED, end_trigger=MaxIteration(args.iterations),
                                  progress_bar=False, local_steps=LOCAL_STEPS,
                                  allreduce=args.allreduce,
                                  outer_optimizer="average")
            trained = opt.optimize()
            torch.save(trained.state_dict(), os.path.join(args.out, f"{key}.pt"))
            weights = sum(p.numel() * p.element_size() for p in trained.parameters())
            fits[key] = {"weights_bytes": weights, "partitions": partitions,
                         "rounds": args.iterations // LOCAL_STEPS}
    sc.setLocalProperty("spark.jobGroup.id", None)
    spark.stop()
    jobs = job_bytes(event_log_file(log_dir))
    for key, fit in fits.items():
        fit["jobs"] = [{"call_site": j.call_site, "received": j.result_bytes,
                        "sent": j.broadcast_bytes} for j in jobs if j.group == key]
    with open(os.path.join(args.out, "bytes.json"), "w") as out:
        json.dump(fits, out, indent=1)


if __name__ == "__main__":
    main()
