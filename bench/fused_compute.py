"""Is fused (stacked) compute of same-architecture models faster in a task? (issue 36)

A pass task computes its M fits one after another, each its forward and backward on its own
replica. The alternative measured here computes them stacked, as HFTA does: the M models'
parameters stacked along a new first dimension and one ``torch.func.vmap`` of
``functional_call`` over them, the batch shared, one backward for all. Both compute the same
M gradients; the script times each (median of ``--repeats``, after a warm-up) and reports the
largest relative difference of the gradients, per workload and thread count.

    python bench/fused_compute.py                         # W1 and W2, 16 models, 1 and 2 threads
    python bench/fused_compute.py --models 4 --workloads W2 --threads 1

Batches are a task's share of the global batch on two partitions (W1: 128 of 256, W2: 512 of
1024), CPU only unless ``--device cuda``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch.func import functional_call, vmap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import PARTITIONS, WORKLOADS  # noqa: E402


def one_after_another(models: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor,
                      loss: Callable[..., torch.Tensor]) -> list[list[torch.Tensor]]:
    grads = []
    for model in models:
        model.zero_grad(set_to_none=True)
        loss(model(x), y).backward()
        grads.append([p.grad for p in model.parameters()])
    return grads


def stacked(models: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor,
            loss: Callable[..., torch.Tensor], shell: torch.nn.Module
            ) -> list[list[torch.Tensor]]:
    names = [n for n, _ in models[0].named_parameters()]
    params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
              .requires_grad_() for n in names}

    def one(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return loss(functional_call(shell, p, (xb,)), yb)

    vmap(one, in_dims=(0, None, None), randomness="error")(params, x, y).sum().backward()
    return [[params[n].grad[i] for n in names] for i in range(len(models))]


def timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, count: int, threads: int, device: str, repeats: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    workload = WORKLOADS[name]
    models = []
    for k in range(count):
        model = workload.model()
        with torch.no_grad():            # distinct weights, as a grid's models drift apart
            for p in model.parameters():
                p.mul_(1.0 + 0.01 * k)
        models.append(model.to(device))
    shell = copy.deepcopy(models[0]).to("meta")
    rows = workload.batch // PARTITIONS
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (rows,), generator=gen).to(device)
    loss = torch.nn.CrossEntropyLoss()
    seq = timed(lambda: one_after_another(models, x, y, loss), repeats)
    fused = timed(lambda: stacked(models, x, y, loss, shell), repeats)
    a = one_after_another(models, x, y, loss)
    b = stacked(models, x, y, loss, shell)
    rel = max(float((ga - gb).abs().max() / ga.abs().max().clamp_min(1e-30))
              for la, lb in zip(a, b) for ga, gb in zip(la, lb))
    return {"workload": name, "models": count, "threads": threads, "seq_ms": 1e3 * seq,
            "fused_ms": 1e3 * fused, "max_rel": rel}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=["W1", "W2"])
    p.add_argument("--models", type=int, default=16)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"{args.models} models, one task's share of the batch, {args.device}, torch "
          f"{torch.__version__}; median of {args.repeats}")
    print("| workload | threads | one after another ms | stacked (vmap) ms | stacked's speed-up "
          "| max relative gradient difference |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.workloads:
        for threads in args.threads:
            r = measure(name, args.models, threads, args.device, args.repeats)
            print(f"| {name} | {threads} | {r['seq_ms']:.1f} | {r['fused_ms']:.1f} | "
                  f"{r['seq_ms'] / r['fused_ms']:.2f}x | {r['max_rel']:.1e} |")


if __name__ == "__main__":
    main()
