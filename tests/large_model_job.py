"""A model larger than the driver's heap budget, in its own driver process with a small heap
(``spark.driver.memory=512m``) and ``spark.driver.maxResultSize=16m``: a job may hand the driver
8 MiB, a tenth of the model's 80 MiB vector, and before sparkdl cut large vectors into jobs and
broadcasts into pieces the fit was refused (the whole vector in one job's results).

    python large_model_job.py OUT.pt [MASTER]   # default local-cluster[2,1,1024]
    python large_model_job.py --driver-oom     # the driver's heap runs out: prints the error
    python large_model_job.py --executor-oom   # the same job on local-cluster: the executors'
    python large_model_job.py --getter-oom     # local-cluster, 2g executors: the driver's
                                               # result-fetching threads run out
    python large_model_job.py --stuck-exit     # local[2]: the driver's JVM stuck exiting

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
ITERATIONS = 2            # the second steps the updated weights with momentum, as any later one
ROUND_ITERATIONS = 4
HIDDEN = 155_000          # 20.0 M parameters: an 80 MiB vector
D = 64


def make_model(hidden: int = HIDDEN) -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(D, hidden), nn.ReLU(), nn.Linear(hidden, D))


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
        import traceback

        traceback.print_exc()        # for the test's failure message
        print(f"error={type(exc).__name__}")
        print(f"message={str(exc).splitlines()[0]}")
    print(f"seconds={time.perf_counter() - started:.1f}")


class _Slow(nn.Module):
    """An identity that takes half a second: a fit whose jobs are still running."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(0.5)
        return x


class _BlockingHook:
    """A shutdown hook of Spark's (a Scala ``() => Unit``, called back in this process) that
    never ends."""

    def __getattr__(self, name: str):
        if name.startswith("apply"):       # apply, and Scala's specialised apply$mcV$sp
            return self.block
        raise AttributeError(name)

    def block(self) -> None:
        import time

        time.sleep(3600)

    class Java:
        implements = ["scala.Function0"]


def stuck_exit(spark) -> None:
    """The driver's JVM begins to exit in the middle of a fit's job (as Spark's handler makes it
    after an OutOfMemoryError in a task on a local master), and a shutdown hook that runs
    before the one stopping the SparkContext blocks: the JVM would never end, nor would the
    fit's job. The watch kills it after EXIT_GRACE_SECONDS (5 here). Prints how the fit ended,
    and how long after the exit began."""
    import logging
    import threading
    import time

    from pyspark.java_gateway import ensure_callback_server_started

    from models import make_rdd
    from sparkdl import DistriOptimizer
    from sparkdl.runners import driver_watch
    from sparkdl.triggers import MaxIteration

    driver_watch.EXIT_GRACE_SECONDS = 5.0
    sc = spark.sparkContext
    ensure_callback_server_started(sc._gateway)
    sc._jvm.org.apache.spark.util.ShutdownHookManager.addShutdownHook(100, _BlockingHook())
    began = []

    def exit_jvm() -> None:
        began.append(time.perf_counter())
        sc._jvm.java.lang.System.exit(52)      # never returns: the JVM is killed meanwhile

    class ExitOnTraining(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("training on") and not began:
                threading.Timer(2.0, exit_jvm).start()

    logging.getLogger("sparkdl").addHandler(ExitOnTraining())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, D)).astype(np.float32)
    rdd = make_rdd(sc, list(zip(x, x)), [16, 16])
    model = nn.Sequential(nn.Linear(D, D), _Slow())
    fit = DistriOptimizer(model, rdd, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                          batch_size=16, end_trigger=MaxIteration(200), seed=1,
                          progress_bar=False)
    try:
        fit.optimize()
        print("exit_error=None")
    except Exception as exc:
        print(f"exit_error={type(exc).__name__}")
        print(f"exit_message={str(exc).splitlines()[0]}")
    print(f"exit_seconds={time.perf_counter() - began[0]:.1f}" if began else "exit_seconds=None")


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
    if sys.argv[1] == "--stuck-exit":
        spark = spark_builder("local[2]").getOrCreate()
        spark.sparkContext.setLogLevel("OFF")
        stuck_exit(spark)
        os._exit(0)          # the JVM is gone: nothing to stop
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
