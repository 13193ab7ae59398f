"""Models as people build them, for the equivalence zoo (importable on the executors), and the
reference that runs the engine's documented rule in one process."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from sparkdl.data.batch_plan import BatchPlan, task_seed


class BatchNormCNN(nn.Module):
    """Conv, BatchNorm2d, pooling: 1x8x8 images, 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))))


class Recommender(nn.Module):
    """A user embedding and a bag of item embeddings (int64 ids) beside dense features."""

    def __init__(self, users: int = 20, items: int = 30, dim: int = 4, dense: int = 3) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.items = nn.EmbeddingBag(items, dim, mode="mean")
        self.out = nn.Sequential(nn.Linear(2 * dim + dense, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([self.user(ids[:, 0]), self.items(ids[:, 1:]), dense], dim=1))


def sinusoidal_encoding(length: int, dim: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    scale = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * scale)
    table[:, 1::2] = torch.cos(position * scale)
    return table


class TinyTransformer(nn.Module):
    """Token embedding + a registered sinusoidal positional buffer, one encoder layer with
    dropout and a padding mask given as an input (1 = padding), LayerNorm, masked mean pool."""

    def __init__(self, vocab: int = 16, dim: int = 8, length: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.register_buffer("position", sinusoidal_encoding(length, dim))
        self.encoder = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=16, dropout=0.1,
                                                  batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, 2)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        pad = padding.bool()
        h = self.encoder(self.embed(tokens) + self.position, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.out(self.norm((h * keep).sum(1) / keep.sum(1).clamp(min=1.0)))


class GRUClassifier(nn.Module):
    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(self.embed(tokens))
        return self.out(h[-1])


class UnusedBranch(nn.Module):
    """A second head that forward never uses: its parameters never get a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.used = nn.Linear(8, 3)
        self.unused = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(torch.tanh(self.body(x)))


class DictOutput(nn.Module):
    """Returns a dict, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.tanh(self.body(x))
        return {"logits": self.head(hidden), "hidden": hidden}


class LogitsLoss(nn.Module):
    """Cross-entropy on ``output["logits"]``."""

    reduction = "mean"

    def forward(self, output: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output["logits"], target)


class CounterNet(nn.Module):
    """An int64 counter at 2**40 + 7 that every forward increments, and a constant float
    buffer (a frozen scale) that forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.register_buffer("calls", torch.tensor(2 ** 40 + 7, dtype=torch.int64))
        self.register_buffer("scale", torch.linspace(0.3, 1.7, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x * self.scale)


def _combined_buffers(start: dict[str, torch.Tensor],
                      tasks: Sequence[tuple[float, dict[str, torch.Tensor]]]
                      ) -> dict[str, torch.Tensor]:
    """The engine's documented buffer rule, written out plainly."""
    out = {}
    for name, old in start.items():
        values = [b[name] for _, b in tasks]
        if all(torch.equal(v, old) for v in values):
            out[name] = old
        elif all(torch.equal(v, values[0]) for v in values):
            out[name] = values[0]
        elif old.dtype.is_floating_point:
            total = sum(w * (b[name].double() - old.double()) for w, b in tasks)
            out[name] = (old.double() + total).to(old.dtype)
        else:
            total = sum(w * (b[name].long() - old.long()).double() for w, b in tasks)
            out[name] = (old.long() + torch.round(total).long()).to(old.dtype)
    return out


def partitioned_reference_train(model: nn.Module, inputs: tuple[np.ndarray, ...],
                                y: np.ndarray, criterion: Any,
                                make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
                                plan: BatchPlan, iterations: int, seed: int,
                                input_dtype: torch.dtype | None = None,
                                autocast: torch.dtype | None = None) -> nn.Module:
    """Single-process PyTorch on the same union batches, each batch processed as the engine's
    documented rule says: every partition's share from the same weights and buffers, random
    layers seeded with ``task_seed(seed, t, i)``, the loss weighted by the share, gradients
    summed in partition order, buffers combined by the rule. ``input_dtype``: floating inputs
    are cast to it (a 16-bit model fed float32 data, as the engine casts it). Runs with one torch
    thread, as tasks do with ``spark.task.cpus=1``: CPU dropout masks depend on the thread count.
    ``autocast``: forward and loss of every share under ``torch.autocast("cpu", autocast)``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _partitioned(copy.deepcopy(model), inputs, y, criterion, make_optimizer, plan,
                            iterations, seed, input_dtype, autocast)
    finally:
        torch.set_num_threads(threads)


def _partitioned(model: nn.Module, inputs: tuple[np.ndarray, ...], y: np.ndarray, criterion: Any,
                 make_optimizer: Callable[[nn.Module], torch.optim.Optimizer], plan: BatchPlan,
                 iterations: int, seed: int, input_dtype: torch.dtype | None,
                 autocast: torch.dtype | None) -> nn.Module:
    optimizer = make_optimizer(model)
    for t in range(iterations):
        epoch, step = plan.epoch_and_step(t)
        _, counts = plan.shares(epoch, step)
        batch = int(counts.sum())
        start = {k: v.detach().clone() for k, v in model.named_buffers()}
        optimizer.zero_grad(set_to_none=True)
        tasks = []
        for i in range(plan.num_partitions):
            if counts[i] == 0:
                continue
            with torch.no_grad():
                for k, v in model.named_buffers():
                    v.copy_(start[k])
            idx = plan.offsets[i] + plan.local_indices(epoch, step, i)
            torch.manual_seed(task_seed(seed, t, i))
            batch_inputs = [torch.from_numpy(a[idx]) for a in inputs]
            if input_dtype is not None:
                batch_inputs = [b.to(input_dtype) if b.is_floating_point() else b
                                for b in batch_inputs]
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=bool(autocast)):
                loss = criterion(model(*batch_inputs), torch.from_numpy(y[idx]))
            (loss * (counts[i] / batch)).backward()
            tasks.append((counts[i] / batch,
                          {k: v.detach().clone() for k, v in model.named_buffers()}))
        with torch.no_grad():
            for k, v in _combined_buffers(start, tasks).items():
                dict(model.named_buffers())[k].copy_(v)
        optimizer.step()
    return model


class OverflowNet(nn.Module):
    """Rows whose first feature is above 3 get logits a thousand times larger: under float16
    autocast their gradient overflows at a large loss scale (an injected inf)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        boost = 1.0 + 1000.0 * (x[:, :1] > 3).float()
        return self.fc2(torch.tanh(self.fc1(x))) * boost
