"""Local rounds as their definition says, in plain single-process PyTorch, worker after worker
(docs/guide/local-rounds.md; design notes section 8). The tests compare sparkdl's rounds with it.

Only the data plan is sparkdl's (which samples each partition takes at each iteration:
``BatchPlan``, the data definition shared with synchronous SGD); everything else is torch.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from sparkdl.data.batch_plan import BatchPlan, task_seed


def _round_bounds(total: int, per_epoch: int, local_steps: int, warmup: int) -> list[tuple[int, int]]:
    """The rounds after the warm-up: H iterations each, never across an epoch's end, the last
    one cut at the fit's end."""
    bounds, t = [], warmup
    while t < total:
        epoch_start = (t // per_epoch) * per_epoch
        base = max(warmup, epoch_start)
        end = min(base + ((t - base) // local_steps + 1) * local_steps,
                  epoch_start + per_epoch, total)
        bounds.append((t, end))
        t = end
    return bounds


def _average_buffers(model: nn.Module, before: dict, after: list[dict], taken: list[int]
                     ) -> None:
    """Every buffer the sample-weighted average of the workers' values,
    ``old + sum_i (n_i / n) * (b_i - old)`` in float64 (integers rounded)."""
    n = sum(taken)
    with torch.no_grad():
        for name, b in model.named_buffers():
            old = before[name].double()
            new = old + sum((n_i / n) * (values[name].double() - old)
                            for values, n_i in zip(after, taken) if n_i)
            b.copy_(torch.round(new) if not b.is_floating_point() else new)


def _forward_loss(model: nn.Module, criterion: Any, x: Sequence[np.ndarray], y: np.ndarray,
                  idx: np.ndarray) -> torch.Tensor:
    out = model(*[torch.from_numpy(a[idx]) for a in x])
    return criterion(out, torch.from_numpy(y[idx]))


def rounds_reference(model: nn.Module, partitions: Sequence[tuple[Any, np.ndarray]],
                     criterion: Any, make_optimizer: Callable[[nn.Module], Any],
                     batch_size: int, seed: int, iterations: int, local_steps: int,
                     outer: str | Callable[[list], Any] | None = None, warmup: int = 0,
                     make_scheduler: Callable[[Any], Any] | None = None,
                     scheduler_step: str = "epoch", shuffle: bool = True) -> nn.Module:
    """``model`` trained for ``iterations`` iterations in local rounds (a copy is returned).

    ``partitions``: each partition's ``(x, y)`` (``x`` an array or a tuple of arrays), in
    partition order. Dropout in worker ``i`` at iteration ``t`` draws from torch's generator
    seeded ``task_seed(seed, t, i)``, as synchronous SGD's task does."""
    model = copy.deepcopy(model)
    parts = [((x if isinstance(x, tuple) else (x,)), y) for x, y in partitions]
    sizes = [len(y) for _, y in parts]
    plan = BatchPlan(sizes, batch_size, seed, shuffle)
    per_epoch = plan.iterations_per_epoch
    optimizer = make_optimizer(model)
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    # the warm-up: synchronous SGD on the union batches, as data-parallel SGD computes it
    # (each partition's forward on its share, as DDP without SyncBN: BatchNorm's statistics
    # per share, its running buffers averaged by the shares' sizes)
    for t in range(min(warmup, iterations)):
        epoch, step = plan.epoch_and_step(t)
        before = {k: v.clone() for k, v in model.named_buffers()}
        taken, after = [], []
        optimizer.zero_grad()
        for i, (x, y) in enumerate(parts):
            idx = plan.local_indices(epoch, step, i)
            if not len(idx):
                continue
            with torch.no_grad():
                for k, b in model.named_buffers():
                    b.copy_(before[k])
            torch.manual_seed(task_seed(seed, t, i))
            (_forward_loss(model, criterion, x, y, idx) * (len(idx) / plan.batch_size_at(step))
             ).backward()
            taken.append(len(idx))
            after.append({k: v.clone() for k, v in model.named_buffers()})
        _average_buffers(model, before, after, taken)
        optimizer.step()
        if scheduler is not None and (scheduler_step == "iteration" or step == per_epoch - 1):
            scheduler.step()
    if iterations <= warmup:
        return model
    # every worker starts from the synchronous optimizer's (and scheduler's) state
    workers = []
    for _ in parts:
        worker = copy.deepcopy(model)
        opt = make_optimizer(worker)
        sched = make_scheduler(opt) if make_scheduler else None
        if sched is not None:       # (a new scheduler sets the lr: the optimizer's state after)
            sched.load_state_dict(scheduler.state_dict())
        opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        workers.append((worker, opt, sched))
    trainable = [p for p in model.parameters() if p.requires_grad]
    if outer is None or outer == "average":
        outer_opt = torch.optim.SGD(trainable, lr=1.0)
    elif outer == "nesterov":
        outer_opt = torch.optim.SGD(trainable, lr=0.7, momentum=0.9, nesterov=True)
    else:
        outer_opt = outer(trainable)
    for first, end in _round_bounds(iterations, per_epoch, local_steps, warmup):
        start = copy.deepcopy(model.state_dict())
        taken = [0] * len(parts)
        for i, ((x, y), (worker, opt, sched)) in enumerate(zip(parts, workers)):
            worker.load_state_dict(start)
            for t in range(first, end):
                epoch, step = plan.epoch_and_step(t)
                idx = plan.local_indices(epoch, step, i)
                if len(idx):
                    torch.manual_seed(task_seed(seed, t, i))
                    opt.zero_grad()
                    _forward_loss(worker, criterion, x, y, idx).backward()
                    opt.step()
                    taken[i] += len(idx)
                if sched is not None and (scheduler_step == "iteration"
                                          or step == per_epoch - 1):
                    sched.step()
        n = sum(taken)
        _average_buffers(model, dict(start), [dict(w.named_buffers()) for w, _, _ in workers],
                         taken)
        named = dict(model.named_parameters())
        with torch.no_grad():
            for name, p in named.items():
                if not p.requires_grad:
                    continue
                delta = torch.zeros_like(p)
                for (worker, _, _), n_i in zip(workers, taken):
                    if n_i:
                        delta += (n_i / n) * (start[name] - dict(worker.named_parameters())[name])
                p.grad = delta
        outer_opt.step()
        outer_opt.zero_grad()
    return model
