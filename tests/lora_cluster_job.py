"""A LoRA fit of a pretrained base in its own driver process (only one SparkContext can live in a
process): first undisturbed, then the same fit through a failed task and a killed executor.

    python lora_cluster_job.py MASTER BASE_DIR OUT.pt MARKER_DIR

Saves ``{"clean": {...}, "faulted": {...}}`` (the trained parameters of each fit) to OUT.pt and
prints, after each fit, how many bases each executor's Python workers loaded (``clean_loads=``,
``faulted_loads=``: JSON, executor -> loads summed over its workers) and the executors that ran
the faulted fit's training tasks (``task_executors=``).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import _claim_once, _kill_executor_jvm, make_rdd  # noqa: E402

from sparkdl.adapters.huggingface import HuggingFaceStep  # noqa: E402

SIZES, BATCH, SEED, ITERATIONS, VOCAB, LENGTH = [30, 14, 22, 18], 12, 4, 6, 40, 8
TASK_FAULT_AT, EXECUTOR_FAULT_AT = 3, 10
"""The training steps (counted over the whole cluster) at which a task fails on its first
attempt, and at which the executor running the step is killed."""


class FaultingStep(HuggingFaceStep):
    """huggingface_step that fails one task and kills one executor, each once per run, at the
    cluster's ``TASK_FAULT_AT``-th and ``EXECUTOR_FAULT_AT``-th training step (counted in a
    file under ``markers``)."""

    def __init__(self, markers: str) -> None:
        super().__init__(("input_ids", "attention_mask"))
        self.markers = markers

    def __call__(self, model, inputs, target):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and torch.is_grad_enabled():
            with open(os.path.join(self.markers, "steps"), "ab") as f:
                f.write(b".")
            calls = os.path.getsize(os.path.join(self.markers, "steps"))
            if calls >= TASK_FAULT_AT and ctx.attemptNumber() == 0 and \
                    _claim_once(os.path.join(self.markers, "task")):
                raise RuntimeError("injected task failure (first attempt)")
            if calls >= EXECUTOR_FAULT_AT and _claim_once(os.path.join(self.markers, "executor")):
                _kill_executor_jvm()
        return super().__call__(model, inputs, target)


def token_records():
    """Right-padded token ids and masks with causal LM labels (-100 on the padding)."""
    rng = np.random.default_rng(11)
    n = sum(SIZES)
    ids = rng.integers(1, VOCAB, (n, LENGTH))
    lengths = rng.integers(2, LENGTH + 1, n)
    mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.int64)
    ids = (ids * mask).astype(np.int64)
    labels = np.where(mask == 1, ids, -100).astype(np.int64)
    return [((i, m), y) for i, m, y in zip(ids, mask, labels)]


def worker_loads(sc):
    """Executor id -> bases loaded by its Python workers (over a job reaching every core)."""
    def loads(_):
        from sparkdl.adapters.pretrained import base_loads
        from sparkdl.executor.executor_identity import executor_location

        yield executor_location(), os.getpid(), base_loads()

    found = {}
    for executor, pid, n in sc.parallelize(range(8), 8).mapPartitions(loads).collect():
        found.setdefault(executor, {})[pid] = n
    return {e: sum(pids.values()) for e, pids in sorted(found.items())}


def fit(sc, base_dir, step):
    from peft import LoraConfig

    from sparkdl import DistriOptimizer
    from sparkdl.adapters import PretrainedModel
    from sparkdl.adapters.pretrained import trainable_parameters
    from sparkdl.triggers import MaxIteration

    pretrained = PretrainedModel(base_dir, "AutoModelForCausalLM", peft_config=LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    opt = DistriOptimizer(pretrained, make_rdd(sc, token_records(), SIZES),
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2), batch_size=BATCH,
                          end_trigger=MaxIteration(ITERATIONS), seed=SEED, training_step=step)
    trained = opt.optimize()
    return {n: p.detach().clone() for n, p in trainable_parameters(trained)}, opt


def main() -> None:
    master, base_dir, out, markers = sys.argv[1:5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO,
                        format="%(relativeCreated)d %(name)s %(levelname)s %(message)s")
    from cluster_job import wait_for_executors, warm_executors
    from conftest import spark_builder

    spark = spark_builder(master).config("spark.executor.memory", "768m").getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    count = int(master.split("[")[1].split(",")[0]) if master.startswith("local-cluster") else 0
    if count:
        warm_executors(sc, count)
    from sparkdl.adapters import huggingface_step

    clean, _ = fit(sc, base_dir, huggingface_step(("input_ids", "attention_mask")))
    print("clean_loads=" + json.dumps(worker_loads(sc)))
    faulted, opt = fit(sc, base_dir, FaultingStep(markers))
    if count:      # the killed executor's replacement joins, then runs the loads job too
        wait_for_executors(sc, count)
    print("faulted_loads=" + json.dumps(worker_loads(sc)))
    print(f"iterations={len(opt.summary.iterations)}")
    print(f"shards_rebuilt={opt.summary.shards_rebuilt}")
    print("task_executors=" + json.dumps(sorted({e for r in opt.summary.iterations
                                                 for e in r.executors.values() if e})))
    torch.save({"clean": clean, "faulted": faulted}, out)
    spark.stop()


if __name__ == "__main__":
    main()
