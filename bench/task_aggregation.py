"""How a task with several cores should use them, measured per model kind in a plain process.

A Spark task that owns ``c`` cores (``spark.task.cpus = c``) can run its share of the batch on
one replica with ``c`` intra-op torch threads, or on ``c`` sub-replicas in Python threads, one
intra-op thread each, each taking a contiguous ``1/c`` of the share, their gradients summed in
sub-replica order (``sub_replicas`` in sparkdl). This times one forward + backward of a task's
share both ways, with the 1-thread single-replica time beside it, for the reference workloads'
models (``../shared/docs/benchmarks.md``: W1 MLP, W2 LeNet-5, W3 the 76 MiB MLP), an
embedding-bag recommender and a two-layer transformer encoder::

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

class Recommender(nn.Module):
    """Ids into a 100k x 32 table, summed per row, and an MLP (a W4-like model)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.EmbeddingBag(100_000, 32, mode="sum")
        self.head = mlp([32, 64, 10])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids))


class TinyTransformer(nn.Module):
    """Two encoder layers (d 64, 4 heads, no dropout) over 32 tokens, mean-pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.out = nn.Linear(64, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(self.embed(ids)).mean(1))


MODELS = {
    "W1": (lambda: mlp([784, 256, 10]), 128),
    "W2": (lambda: lenet5(), 512),
    "W3": (lambda: mlp([784, 4096, 4096, 10]), 64),
    "recommender": (Recommender, 1024),
    "transformer": (TinyTransformer, 128),
}


def batch(name: str, share: int) -> torch.Tensor:
    if name == "W2":
        return torch.randn(share, 1, 28, 28)
    if name == "recommender":
        return torch.randint(0, 100_000, (share, 8))
    if name == "transformer":
        return torch.randint(0, 1000, (share, 32))
    return torch.randn(share, 784)


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
        x = batch(name, share)
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
