"""Where a fit's local rounds begin and end (driver side).

A fit with ``local_steps=H`` trains its first ``sync_warmup`` iterations with synchronous SGD
(post-local SGD), then in rounds of H iterations. A round never crosses an epoch's end: within
each epoch the rounds start at the epoch's first iteration after the warm-up and take H
iterations each, the last one of the epoch the rest (an epoch of N iterations after the
warm-up is ``ceil(N / H)`` rounds). A round also ends where the end trigger's count ends the
fit (``MaxEpoch``, ``MaxIteration``). So epoch ends (per-epoch schedulers, ``EveryEpoch``
validation and checkpoints) always fall on a round's end, and every run of the same settings
cuts its rounds at the same iterations, resumed or not.

Example::

    round_end(iteration=40, per_epoch=100, local_steps=16, warmup=10, planned=None)   # 42
"""

from __future__ import annotations

__all__ = ["round_end", "in_warmup"]


def in_warmup(iteration: int, warmup: int) -> bool:
    """Whether 0-based ``iteration`` is one of the synchronous warm-up's."""
    return iteration < warmup


def round_end(iteration: int, per_epoch: int, local_steps: int, warmup: int,
              planned: int | None) -> int:
    """The 0-based iteration after the last of the round that starts at (or contains)
    ``iteration`` (at or after the warm-up; see the module docstring)."""
    epoch_start = (iteration // per_epoch) * per_epoch
    base = max(warmup, epoch_start)
    end = base + ((iteration - base) // local_steps + 1) * local_steps
    end = min(end, epoch_start + per_epoch)
    if planned is not None and iteration < planned:
        end = min(end, planned)
    return end
