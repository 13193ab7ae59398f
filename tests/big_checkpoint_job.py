"""A model whose checkpoint is above 250 MB, trained in its own driver process with Spark's
default driver memory (1 GiB): ~22 M float32 parameters under Adam (weights plus two moments).

    python big_checkpoint_job.py OUT.pt ITERATIONS [CHECKPOINT_DIR]

Trains ``ITERATIONS`` iterations (resuming from CHECKPOINT_DIR when it holds a checkpoint,
writing one after every 2 iterations) and saves the final state_dict to OUT.pt.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

IN, OUT = 2400, 9000


def log_digests() -> None:
    """Each iteration's summed gradient and weights before and after the update, as digests on
    stderr ("digest iteration N: ..."): if a resumed run ever ends other than the uninterrupted
    one, the test's message shows the first iteration where they part."""
    import hashlib

    from sparkdl.engine.strategies.sync import step as training_loop

    def digest(a) -> str:
        return hashlib.sha1(np.ascontiguousarray(np.asarray(a)).tobytes()).hexdigest()[:12]

    complete = training_loop.SyncStep.complete

    def optimizer(self) -> str:
        state = self.ctx.optimizer.state_dict()["state"]
        return " ".join(f"{k}:{name}={digest(v.numpy())}" for k, slots in sorted(state.items())
                        for name, v in sorted(slots.items()))

    def logged(self, result):
        before, vector = digest(np.array(self._next_weights.state, copy=True)), result.vector
        iteration, opt_before = self.ctx.iteration, optimizer(self)
        done = complete(self, result)
        print(f"digest iteration {iteration}: gradient {digest(vector)} weights "
              f"{before} -> {digest(self._next_weights.state)} optimizer {opt_before} -> "
              f"{optimizer(self)} threads {torch.get_num_threads()}", file=sys.stderr,
              flush=True)
        return done

    training_loop.SyncStep.complete = logged


def main() -> None:
    out, iterations = sys.argv[1], int(sys.argv[2])
    checkpoint_dir = sys.argv[3] if len(sys.argv) > 3 else None
    from conftest import spark_builder
    from models import make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration, SeveralIteration

    log_digests()
    spark = spark_builder("local[2]").getOrCreate()     # spark.driver.memory: the default
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    assert sc.getConf().get("spark.driver.memory", "1g") == "1g"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, IN)).astype(np.float32)
    y = rng.integers(0, OUT, 24)
    torch.manual_seed(0)
    net = torch.nn.Linear(IN, OUT)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [14, 10]),
                          torch.nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-3),
                          batch_size=8, end_trigger=MaxIteration(iterations), seed=1,
                          progress_bar=False)
    if checkpoint_dir:
        opt.set_checkpoint(checkpoint_dir, SeveralIteration(2), keep_last=1)
    opt.optimize()
    torch.save(net.state_dict(), out)
    spark.stop()


if __name__ == "__main__":
    main()
