"""A model several times each JVM's heap share, on ``local-cluster`` with 512m heaps: the
executors' (``spark.executor.memory=512m``) and the driver's (``spark.driver.memory=512m``).
Spark's memory manager lends such a heap about 127 MiB ((512 MiB - 300 MiB reserved) x
``spark.memory.fraction`` 0.6); the model's vector is 192 MiB. Every record, task result and
broadcast piece that crosses a JVM is at most ``spark.sparkdl.maxRecordBytes`` (32m here), so
the fit trains; once in plain and once with ``spark.io.encryption.enabled`` (the weights then
travel through pyspark's own broadcasts, the shards stay in the Python workers).

    python small_heaps_job.py OUT.pt

Trains two synchronous fits (SGD with momentum, 2 iterations), one per session, and saves
their trained weights for the test to compare with plain single-process torch.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from large_model_job import BATCH, SEED, SIZES, data  # noqa: E402,F401 - the test reads them
from large_model_job import make_model as _mlp  # noqa: E402

ITERATIONS = 2
LR = 0.01
HIDDEN = 390_000          # 50.3 M parameters: a 192 MiB vector
MASTER = "local-cluster[2,1,512]"


def make_model() -> nn.Module:
    return _mlp(HIDDEN)


def train(encrypted: bool) -> dict[str, torch.Tensor]:
    """One session on :data:`MASTER` with 512m heaps, one fit; its trained weights."""
    from conftest import spark_builder
    from models import make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    builder = (spark_builder(MASTER).config("spark.driver.memory", "512m")
               .config("spark.executor.memory", "512m"))
    if encrypted:
        builder = builder.config("spark.io.encryption.enabled", "true")
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    heap = sc._jvm.java.lang.Runtime.getRuntime().maxMemory()
    print(f"encrypted={encrypted} driver_heap_mib={heap / 2**20:.0f} "
          f"executor_memory={sc.getConf().get('spark.executor.memory')}", flush=True)
    x, y = data()
    rdd = make_rdd(sc, list(zip(x, y)), SIZES).cache()
    model = make_model()
    DistriOptimizer(model, rdd, nn.MSELoss(),
                    torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                    batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                    progress_bar=False).optimize()
    spark.stop()
    return model.state_dict()


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO,
                        format="%(relativeCreated)d %(name)s %(levelname)s %(message)s")
    trained = {"plain": train(False), "encrypted": train(True)}
    torch.save(trained, sys.argv[1])


if __name__ == "__main__":
    main()
