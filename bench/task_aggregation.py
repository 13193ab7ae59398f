"""How a task with several cores should use them, measured per model kind in a plain process.

A Spark task that owns ``c`` cores (``spark.task.cpus = c``) can run its share of the batch on
one replica with ``c`` intra-op torch threads, or on ``c`` sub-replicas in Python threads, one
intra-op thread each, each taking a contiguous ``1/c`` of the share, their gradients summed in
sub-replica order (``sub_replicas`` in sparkdl). This times one forward + backward of a task's
share both ways, with the 1-thread single-replica time beside it, for the reference workloads'
models (``../shared/docs/benchmarks.md``: W1 MLP, W2 LeNet-5, W3 the 76 MiB MLP)::

    python bench/task_aggregation.py                  # share 512 (W2), 64 (W3), 128 (W1)
    python bench/task_aggregation.py --cores 2 --repeats 30
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from sparkdl.datasets.reference_models import lenet5, mlp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scaling_model import _median_time as timed  # noqa: E402

MODELS = {
    "W1": (lambda: mlp([784, 256, 10]), 128),
    "W2": (lambda: lenet5(), 512),
    "W3": (lambda: mlp([784, 4096, 4096, 10]), 64),
}


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--workloads", nargs="+", default=list(MODELS))
    args = p.parse_args()
    c = args.cores
    pool = ThreadPoolExecutor(c)
    print(f"| model | share | 1 thread ms | {c} intra-op threads ms | {c} sub-replicas ms "
          "| sub-replicas / intra-op |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.workloads:
        build, share = MODELS[name]
        torch.manual_seed(0)
        model = build()
        subs = [copy.deepcopy(model) for _ in range(c)]
        x = torch.randn(share, 1, 28, 28) if name == "W2" else torch.randn(share, 784)
        y = torch.randint(0, 10, (share,))
        parts = list(zip(x.chunk(c), y.chunk(c)))
        torch.set_num_threads(1)
        one = timed(lambda: step(model, x, y), args.repeats)
        torch.set_num_threads(c)
        intra = timed(lambda: step(model, x, y), args.repeats)
        torch.set_num_threads(1)
        sub = timed(lambda: list(pool.map(lambda s: step(subs[s], *parts[s]), range(c))),
                    args.repeats)
        print(f"| {name} | {share} | {one * 1e3:.1f} | {intra * 1e3:.1f} | {sub * 1e3:.1f} "
              f"| {sub / intra:.2f} |")


if __name__ == "__main__":
    main()
