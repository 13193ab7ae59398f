"""A model larger than the driver's heap budget, in its own driver process with a small heap
(``spark.driver.memory=512m``) and ``spark.driver.maxResultSize=16m``: a job may hand the driver
8 MiB, a tenth of the model's 80 MiB vector, and before sparkdl cut large vectors into jobs and
broadcasts into pieces the fit was refused (the whole vector in one job's results).

    python large_model_job.py OUT.pt [MASTER]   # default local-cluster[2,1,1024]
    python large_model_job.py --driver-oom     # the driver's heap runs out: prints the error
    python large_model_job.py --executor-oom   # the same job on local-cluster: the executors'
    python large_model_job.py --getter-oom     # local-cluster, 2g executors: the driver's
                                               # result-fetching threads run out

Trains a pass of two synchronous fits (SGD with momentum, two learning rates: the pass's
vector is 160 MiB) and one fit in local rounds (H = 2, averaged), and saves their initial and
trained weights for the test to compare with plain single-process torch.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = [40, 56]
BATCH = 24
SEED = 3
ITERATIONS = 3
ROUND_ITERATIONS = 4
HIDDEN = 155_000          # 20.0 M parameters: an 80 MiB vector
D = 64


def make_model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D))


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((sum(SIZES), D)).astype(np.float32)
    return x, (0.5 * x + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)


def _watchdog(spark, seconds: float) -> None:
    """A fit that has not ended after ``seconds`` hangs: print ``hung=SECONDS`` and the driver
    JVM's threads (jstack) for the test's failure message, then exit."""
    import subprocess
    import threading

    def bite() -> None:
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        print(f"hung={seconds}", flush=True)
        try:                     # a JDK's jstack, where there is one
            dump = subprocess.run(["jstack", str(proc.pid)], capture_output=True, text=True,
                                  timeout=30).stdout if proc is not None else ""
        except Exception as exc:  # noqa: BLE001 - the exit below is what matters
            dump = f"no thread dump: {exc}"
        if dump:
            threads = [block for block in dump.split("\n\n")
                       if any(k in block for k in ("task-result-getter", "dag-scheduler",
                                                    "Executor task launch", "SIGTERM",
                                                    "shutdown-hook", "Thread-0\""))]
            print("threads=" + " | ".join(b.replace("\n", " ")[:400] for b in threads),
                  flush=True)
            sys.stderr.write(dump)
        os._exit(3)

    timer = threading.Timer(seconds, bite)
    timer.daemon = True
    timer.start()


def driver_oom(spark) -> None:
    """A 40 M-parameter model on the driver path, every partition's 160 MB vector in one job,
    with ``spark.sparkdl.driverJobBytes`` allowing that on a 512m heap: a local master's tasks
    run in the driver's JVM, which runs out of heap. Prints the error and how long it took."""
    import time

    from models import make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, D)).astype(np.float32)
    rdd = make_rdd(spark.sparkContext, list(zip(x, x)), [16, 16])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 310_000), nn.ReLU(), nn.Linear(310_000, D))
    fit = DistriOptimizer(model, rdd, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                          batch_size=16, end_trigger=MaxIteration(2), seed=1,
                          allreduce="driver", progress_bar=False)
    started = time.perf_counter()
    _watchdog(spark, 120)
    try:
        fit.optimize()
        print("error=None")
    except Exception as exc:
        print(f"error={type(exc).__name__}")
        print(f"message={str(exc).splitlines()[0]}")
    print(f"seconds={time.perf_counter() - started:.1f}")


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO,
                        format="%(relativeCreated)d %(name)s %(levelname)s %(message)s")
    from conftest import spark_builder
    from models import make_rdd
    from sparkdl import DistriOptimizer, FitSet
    from sparkdl.metrics import Loss
    from sparkdl.triggers import MaxIteration, SeveralIteration

    if sys.argv[1] in ("--driver-oom", "--executor-oom", "--getter-oom"):
        master = {"--driver-oom": "local[2]", "--executor-oom": "local-cluster[2,1,1024]",
                  "--getter-oom": "local-cluster[2,1,2048]"}[sys.argv[1]]
        builder = spark_builder(master)
        if sys.argv[1] == "--getter-oom":     # executors that hold their results easily
            builder = builder.config("spark.executor.memory", "2048m")
        spark = (builder.config("spark.driver.memory", "512m")
                 .config("spark.sparkdl.driverJobBytes", "400m").getOrCreate())
        # the getters' case: the driver's log shows the fetches failing of OutOfMemoryError
        spark.sparkContext.setLogLevel("WARN" if sys.argv[1] == "--getter-oom" else "OFF")
        driver_oom(spark)
        return
    # a cluster's way (on a local master the sums and large broadcasts go as files instead)
    master = sys.argv[2] if len(sys.argv) > 2 else "local-cluster[2,1,1024]"
    spark = (spark_builder(master).config("spark.driver.memory", "512m")
             .config("spark.driver.maxResultSize", "16m").getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    heap = sc._jvm.java.lang.Runtime.getRuntime().maxMemory()
    print(f"driver_heap_mib={heap / 2**20:.0f}")
    x, y = data()
    rdd = make_rdd(sc, list(zip(x, y)), SIZES).cache()
    initial = make_model()

    def sync_fit(lr: float) -> DistriOptimizer:
        model = make_model()
        return DistriOptimizer(model, rdd, nn.MSELoss(),
                               torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                               batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                               progress_bar=False)
    fits = [sync_fit(0.005), sync_fit(0.01)]
    fit_set = FitSet(fits)
    fit_set.run()
    print(f"passes={fit_set.passes}")
    model = make_model()
    rounds = DistriOptimizer(model, rdd, nn.MSELoss(), torch.optim.SGD(model.parameters(),
                                                                      lr=0.005),
                             batch_size=BATCH, end_trigger=MaxIteration(ROUND_ITERATIONS),
                             seed=SEED, progress_bar=False, local_steps=2,
                             outer_optimizer="average")
    # the weights of an 80 MiB model as a validation task reads them (pieces, or a file)
    rounds.set_validation(rdd, SeveralIteration(ROUND_ITERATIONS), [Loss()])
    rounds.optimize()
    print(f"validation_loss={rounds.summary.validations[-1].metrics['Loss']!r}")
    torch.save({"initial": initial.state_dict(),
                "sync": [f.model.state_dict() for f in fits],
                "rounds": model.state_dict()}, sys.argv[1])
    spark.stop()


if __name__ == "__main__":
    main()
