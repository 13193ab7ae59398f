"""Where a fit's local rounds begin and end (driver side).

A fit with ``local_steps=H`` trains its first ``sync_warmup`` iterations with synchronous SGD
(post-local SGD), then in rounds of H iterations. A round never crosses an epoch's end: within
each epoch the rounds start at the epoch's first iteration after the warm-up and take H
iterations each, the last one of the epoch the rest (an epoch of N iterations after the
warm-up is ``ceil(N / H)`` rounds). A round also ends where the end trigger's count ends the
fit (``MaxEpoch``, ``MaxIteration``). So epoch ends (per-epoch schedulers, ``EveryEpoch``
validation and checkpoints) always fall on a round's end, and every run of the same settings
cuts its rounds at the same iterations, resumed or not.

A round cut by the end trigger is not one of a longer fit's rounds: ``MaxIteration(10)`` with
H = 4 trains rounds 1-4, 5-8 and 9-10, ``MaxIteration(20)`` trains 9-12 where the shorter fit
stopped. :func:`ends_a_round` says whether a resumed fit's rounds end where its checkpoint was
taken.

Example::

    round_end(iteration=40, per_epoch=100, local_steps=16, warmup=10, planned=None)   # 42
    longest_round(per_epoch=4, local_steps=1000, warmup=0, planned=None)             # 4
"""

from __future__ import annotations

__all__ = ["round_end", "round_start", "ends_a_round", "longest_round", "in_warmup"]


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


def round_start(iteration: int, per_epoch: int, local_steps: int, warmup: int) -> int:
    """The 0-based first iteration of the round that contains ``iteration`` (at or after the
    warm-up)."""
    base = max(warmup, (iteration // per_epoch) * per_epoch)
    return base + ((iteration - base) // local_steps) * local_steps


def ends_a_round(done: int, per_epoch: int, local_steps: int, warmup: int,
                 planned: int | None) -> bool:
    """Whether a fit that has trained ``done`` iterations stands between two of its steps:
    the end of its warm-up or of one of its rounds (``planned``: where its end trigger's count
    ends it)."""
    return done <= warmup or round_end(done - 1, per_epoch, local_steps, warmup,
                                       planned) == done


def longest_round(per_epoch: int, local_steps: int, warmup: int, planned: int | None) -> int:
    """The most iterations any round of the fit takes (``local_steps`` at most; fewer where
    an epoch or the end trigger's count is shorter; 0 when the warm-up is the whole fit)."""
    stop = warmup + 2 * per_epoch          # a whole epoch after the warm-up's: all lengths
    if planned is not None:
        stop = min(stop, planned)
    longest, t = 0, warmup
    while t < stop and longest < local_steps:
        end = round_end(t, per_epoch, local_steps, warmup, planned)
        longest, t = max(longest, end - t), end
    return longest
