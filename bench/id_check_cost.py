"""What the embedding id check costs one task (issue 39), without Spark: W4's two-tower model
(bench/recommender_scale.py, 100,000 user and item rows) on one task's share of W4's batch
(1,024 rows), forward and backward on one thread, with and without
:func:`sparkdl.executor.id_checks.checked_ids` around the forward.

    python bench/id_check_cost.py

Prints the step's time both ways (the best of 6 rounds of 100 steps, interleaved), the cost of
entering and leaving the check (hooks put on and taken off the two tables) and of ``aminmax``
over one table's 1,024 ids.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recommender_scale import model  # noqa: E402
from sparkdl.executor.id_checks import IdOrigin, checked_ids  # noqa: E402

ROWS, ROUNDS, STEPS = 1024, 6, 100


def main() -> None:
    torch.set_num_threads(1)
    net = model(100_000)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(np.stack([rng.integers(0, 100_000, ROWS),
                                     rng.integers(0, 100_000, ROWS)], 1))
    target = torch.randn(ROWS)
    origin = IdOrigin(partition=0, records=np.arange(ROWS))

    def step(check: bool) -> None:
        net.zero_grad(set_to_none=True)
        if check:
            with checked_ids(net, [ids], origin):
                out = net(ids)
        else:
            out = net(ids)
        torch.nn.functional.mse_loss(out, target).backward()

    for check in (False, True, False, True):          # warm-up
        for _ in range(20):
            step(check)
    best = {False: float("inf"), True: float("inf")}
    for _ in range(ROUNDS):
        for check in (False, True):
            t0 = time.perf_counter()
            for _ in range(STEPS):
                step(check)
            best[check] = min(best[check], (time.perf_counter() - t0) / STEPS * 1e6)
    t0 = time.perf_counter()
    for _ in range(2000):
        with checked_ids(net, [ids], origin):
            pass
    enter = (time.perf_counter() - t0) / 2000 * 1e6
    t0 = time.perf_counter()
    for _ in range(2000):
        torch.aminmax(ids[:, 1])
    aminmax = (time.perf_counter() - t0) / 2000 * 1e6
    print(f"one task's step ({ROWS} rows, forward + backward): {best[False]:.0f} us without the "
          f"id check, {best[True]:.0f} us with it (+{best[True] - best[False]:.0f} us)")
    print(f"entering and leaving the check: {enter:.1f} us; aminmax of {ROWS} ids: "
          f"{aminmax:.1f} us")


if __name__ == "__main__":
    main()
