"""A small training run in its own driver process (only one SparkContext can live in a process).

    python cluster_job.py MASTER OUT.pt [--fault task|executor|executor-validation
                          --marker PATH] [--secure] [--checkpoint DIR] [--iterations N]
                          [--allreduce auto|shuffle|driver] [--validation] [--sizes N,N,..]
                          [--locality-wait 0] [--slow-partition P] [--encrypt-io]
                          [--scan-local-dir DIR] [--slow-executor WORKER_DIR]
                          [--warm-executors N] [--conf KEY=VALUE ...] [--tables]
                          [--fault-at-call N] [--local-steps H --outer average|nesterov]

Prints the number of executors, the number of finished iterations, and saves the trained
state_dict. Used by the tests that need a master other than the session's local[2], faults, or a
driver that gets killed. cluster_scenarios.py runs several of these runs in one driver process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import (FaultInjectingLoss, SlowExecutorLoss, SlowPartitionLoss,  # noqa: E402
                    SmallNet, TablesNet, classification_data, id_pairs_data,
                    kill_driver_after_first_checkpoint, make_rdd, split_sizes,
                    tables_optimizer)

SIZES = [40, 0, 25, 35]
BATCH = 16
ITERATIONS = 6
SEED = 5


def executor_dirs(sc):
    """The executors' work directories (their working directory and SparkFiles root; their
    local directories are spark.local.dir, the caller's)."""
    def where(_):
        from pyspark import SparkFiles

        return [os.getcwd(), os.path.abspath(SparkFiles.getRootDirectory())]

    width = 2 * max(2, sc.defaultParallelism)
    return sorted({d for ds in sc.parallelize(range(width), width).map(where).collect()
                   for d in ds})


def wait_for_executors(sc, count: int, timeout: float = 120) -> int:
    """Wait until ``count`` executors have registered; the number registered."""
    deadline = time.time() + timeout
    while (registered := sc._jsc.sc().getExecutorMemoryStatus().size() - 1) < count:
        if time.time() > deadline:
            raise RuntimeError(f"fewer than {count} executors registered in {timeout:.0f} s")
        time.sleep(0.2)
    return registered


def local_cluster_executors(master: str) -> int | None:
    """The number of executors of a ``local-cluster[N,cores,memory]`` master (None for any
    other master): a killed one is relaunched by its worker."""
    if not master.startswith("local-cluster"):
        return None
    return int(master.split("[")[1].split(",")[0])


def warm_executors(sc, count: int, timeout: float = 120) -> None:
    """Wait until ``count`` executors have registered, then run a task on each of their cores
    (``spark.executor.cores``) that imports torch and sparkdl, so that no later task pays a
    cold Python worker: an executor runs a Python worker per task running at once. With
    speculation on, a first task that takes seconds to import torch gets a copy on a warm
    executor; a copy that wins the shard build moves that shard (and its training tasks) to the
    other executor."""
    wait_for_executors(sc, count, timeout)

    def load(_):
        import importlib

        for module in ("torch", "sparkdl"):
            importlib.import_module(module)
        time.sleep(1.0)     # each task holds its executor's one core: the next goes elsewhere
        return [os.getcwd()]

    slots = count * int(sc.getConf().get("spark.executor.cores", "1"))
    dirs: set[str] = set()
    for _ in range(3):    # a speculative copy may win a round on the other executor
        dirs |= set(sc.parallelize(range(slots), slots).mapPartitions(load).collect())
        if len(dirs) >= count:
            return
    raise RuntimeError(f"the warm-up ran on {len(dirs)} of {count} executors: {sorted(dirs)}")


def task_result_sizes(sc, before=()):
    """The ``resultSize`` metric (bytes of the serialized result a task sent the driver) of
    every task of every job so far but the jobs ``before``, from the application's status
    store."""
    store, tracker = sc._jsc.sc().statusStore(), sc.statusTracker()
    sizes = []
    for job in set(tracker.getJobIdsForGroup(None)) - set(before):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info is not None else ()):
            for attempt in range(4):
                tasks = store.taskList(int(stage), attempt, 1 << 30)
                for k in range(tasks.size()):
                    metrics = tasks.apply(k).taskMetrics()
                    if metrics.isDefined():
                        sizes.append(int(metrics.get().resultSize()))
    return sizes


def files_containing(dirs, patterns):
    """Files under ``dirs`` that contain any of the byte strings ``patterns``, and how many
    files were read."""
    hits, read = set(), 0
    for top in dirs:
        for root, _, names in os.walk(top):
            for name in names:
                path = os.path.join(root, name)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                read += 1
                if any(p in data for p in patterns):
                    hits.add(path)
    return sorted(hits), read


class ChangingPartition:
    """An RDD's partition function whose partition ``partition`` gives other contents from its
    second computation on (the first leaves ``marker``): a stale or tampered source."""

    def __init__(self, parts, partition: int, marker: str) -> None:
        self.parts, self.partition, self.marker = parts, partition, marker

    def __call__(self, i, _):
        rows = self.parts[i]
        if i == self.partition:
            if os.path.exists(self.marker):
                features, label = rows[0]
                rows = [(features + 1.0, label)] + rows[1:]
            else:
                open(self.marker, "w").close()
        return iter(rows)


def train(sc, iterations=ITERATIONS, criterion=None, checkpoint=None, allreduce="auto",
          validation=False, sizes=SIZES, during=None, tables=False, changing=None,
          local_steps=1, outer=None, hidden=8):
    """``during``: called once with no argument after the third iteration (a scan of the
    executors' disks, for instance). ``tables``: a TablesNet (sparse embedding tables under
    SparseAdam, the head under Adam) on id pairs, without a scheduler. ``changing``:
    ``(partition, marker)``, that partition changes after its first computation.
    ``local_steps``, ``outer``: local rounds (DistriOptimizer's local_steps, outer_optimizer).
    ``hidden``: SmallNet's hidden width (500_000: a 20 MB model)."""
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration, SeveralIteration, Trigger

    class CallingTrigger(Trigger):
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, state):
            if during is not None and state.iteration == 3:
                during()
            return self.inner(state)

    x, y = (id_pairs_data if tables else classification_data)(sum(sizes), seed=1)
    torch.manual_seed(7)
    net = TablesNet() if tables else SmallNet(hidden=hidden)
    optimizer = tables_optimizer(net) if tables else torch.optim.Adam(net.parameters(), lr=0.01)
    rdd = make_rdd(sc, list(zip(x, y)), sizes)
    if changing is not None:
        spans = split_sizes(sum(sizes), sizes)
        parts = [list(zip(x, y))[a:b] for a, b in spans]
        rdd = sc.parallelize(range(len(parts)), len(parts)).mapPartitionsWithIndex(
            ChangingPartition(parts, *changing))
    opt = DistriOptimizer(net, rdd,
                          criterion or torch.nn.CrossEntropyLoss(), optimizer,
                          batch_size=BATCH, end_trigger=CallingTrigger(MaxIteration(iterations)),
                          seed=SEED,
                          lr_scheduler=None if tables else
                          torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7),
                          allreduce=allreduce, local_steps=local_steps, outer_optimizer=outer)
    if validation:
        from sparkdl import Loss, Top1Accuracy

        vx, vy = classification_data(60, seed=2)
        opt.set_validation(make_rdd(sc, list(zip(vx, vy)), [20, 25, 15]), SeveralIteration(2),
                           [Top1Accuracy(threshold=0.0), Loss()], batch_size=8)
    if checkpoint:
        opt.set_checkpoint(checkpoint, SeveralIteration(2), keep_last=2)
    trained = opt.optimize()
    return trained, opt


def resume_after_a_killed_driver(tmp_path, iterations, *extra):
    """cluster_job.py on local[2] with checkpoints, SIGKILLed after its first checkpoint, then
    run again: the second run's process (which resumed from the newest checkpoint the first left)
    and the SmallNet it saved."""
    import subprocess

    ckpt, out = tmp_path / "ckpt", tmp_path / "weights.pt"
    cmd = [sys.executable, os.path.abspath(__file__), "local[2]", str(out),
           "--checkpoint", str(ckpt), "--iterations", str(iterations), *extra]
    kill_driver_after_first_checkpoint(cmd, ckpt)
    assert not out.exists()
    survivors = sorted(int(f[11:21]) for f in os.listdir(ckpt) if f.startswith("checkpoint-"))
    assert survivors and survivors[-1] < iterations
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resuming from checkpoint {ckpt}/checkpoint-{survivors[-1]:010d}.pt" in second.stderr
    resumed = SmallNet()
    resumed.load_state_dict(torch.load(out, weights_only=True))
    return second, resumed


def parser() -> argparse.ArgumentParser:
    """The command line of one run (module docstring)."""
    p = argparse.ArgumentParser()
    p.add_argument("master")
    p.add_argument("out")
    p.add_argument("--fault", choices=["task", "worker", "executor", "executor-validation"])
    p.add_argument("--allreduce", default="auto")
    p.add_argument("--validation", action="store_true")
    p.add_argument("--marker")
    p.add_argument("--fault-at-call", type=int, default=3,
                   help="the fault comes at this call of the loss in a worker")
    p.add_argument("--tables", action="store_true",
                   help="train TablesNet (sparse tables, SparseAdam + Adam) on id pairs")
    p.add_argument("--secure", action="store_true")
    p.add_argument("--local-steps", type=int, default=1, help="local rounds of this many "
                   "iterations")
    p.add_argument("--outer", help="the local rounds' outer optimizer")
    p.add_argument("--checkpoint")
    p.add_argument("--hidden", type=int, default=8, help="SmallNet's hidden width")
    p.add_argument("--result-sizes", action="store_true", help="print the largest task "
                   "result and the task results' bytes per iteration (Spark's resultSize)")
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)),
                   help="samples per partition, comma separated")
    p.add_argument("--locality-wait", help="spark.locality.wait, e.g. 0")
    p.add_argument("--slow-partition", type=int, help="this partition's tasks take 0.4 s more (-1: every partition's)")
    p.add_argument("--slow-executor", help="the tasks of the executor under this worker "
                   "directory (a standalone worker's --work-dir name) take 1.5 s more")
    p.add_argument("--slow-seconds", type=float, default=1.5,
                   help="how much slower --slow-executor's training tasks are")
    p.add_argument("--changing-partition", type=int, help="this partition gives other "
                   "samples from its second computation on (with --marker)")
    p.add_argument("--encrypt-io", action="store_true", help="spark.io.encryption.enabled")
    p.add_argument("--conf", action="append", default=[], help="KEY=VALUE, a Spark setting")
    p.add_argument("--warm-executors", type=int, help="wait for this many executors and "
                   "import torch and sparkdl on each before training")
    p.add_argument("--scan-local-dir", help="spark.local.dir; during training, the executors' "
                   "directories and this one are searched for the training data's bytes")
    return p


SESSION_SETTINGS = ("master", "secure", "locality_wait", "encrypt_io", "scan_local_dir", "conf")
"""The options that configure the SparkContext rather than one fit: runs in one driver process
(cluster_scenarios.py) must agree on them."""


def start_session(args):
    """The SparkSession of ``args`` (its master and :data:`SESSION_SETTINGS`), logging at INFO
    to stderr, Spark's own log at ERROR."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO,
                        format="%(relativeCreated)d %(name)s %(levelname)s %(message)s")
    from conftest import spark_builder

    builder = spark_builder(args.master).config("spark.executor.memory", "768m")
    if args.secure:
        builder = (builder.config("spark.authenticate", "true")
                   .config("spark.authenticate.secret", uuid.uuid4().hex)
                   .config("spark.network.crypto.enabled", "true")
                   .config("spark.io.encryption.enabled", "true"))
    if args.locality_wait is not None:
        builder = builder.config("spark.locality.wait", args.locality_wait)
    if args.encrypt_io:
        builder = builder.config("spark.io.encryption.enabled", "true")
    if args.scan_local_dir:
        builder = builder.config("spark.local.dir", args.scan_local_dir)
    for setting in args.conf:
        builder = builder.config(*setting.split("=", 1))
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    return spark


def run(spark, args) -> None:
    """One run of ``args`` in ``spark``'s SparkContext: the fit, its saved state_dict and its
    printed report (module docstring)."""
    sc = spark.sparkContext
    jobs_before = set(sc.statusTracker().getJobIdsForGroup(None))
    if args.warm_executors:
        warm_executors(sc, args.warm_executors)
    criterion = (FaultInjectingLoss(args.fault, args.marker, args.fault_at_call) if args.fault
                 else None)
    if args.slow_partition is not None:
        criterion = SlowPartitionLoss(args.slow_partition)
    if args.slow_executor:
        criterion = SlowExecutorLoss(args.slow_executor, args.slow_seconds)
    sizes = [int(n) for n in args.sizes.split(",")]
    scan = None
    if args.scan_local_dir:
        dirs = executor_dirs(sc) + [args.scan_local_dir]
        x, _ = classification_data(sum(sizes), seed=1)
        rows = [x[i].astype("float32").tobytes() for i in range(0, len(x), 7)]

        def scan_disks():
            hits, read = files_containing(dirs, rows)
            print(f"scanned_dirs={dirs}")
            print(f"local_dir_files={files_containing([args.scan_local_dir], [])[1]}")
            print(f"scanned_files={read}")
            print(f"files_with_training_bytes={hits}")
        scan = scan_disks
    started = time.perf_counter()
    trained, opt = train(sc, args.iterations, criterion, args.checkpoint, args.allreduce,
                         args.validation, sizes, scan, args.tables,
                         None if args.changing_partition is None else
                         (args.changing_partition, args.marker), args.local_steps, args.outer,
                         args.hidden)
    print(f"train_seconds={time.perf_counter() - started:.2f}")
    if args.secure:  # inference too: an Arrow UDF over a DataFrame on the secured cluster
        from sparkdl import NNClassifierModel

        x, _ = classification_data(50, seed=9)
        df = spark.createDataFrame([(row.tolist(),) for row in x], ["features"])
        rows = NNClassifierModel(trained).transform(df).filter("prediction >= 0").count()
        print(f"inference_rows={rows}")
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
    killed_an_executor = args.fault in ("executor", "executor-validation")
    if killed_an_executor and local_cluster_executors(args.master):
        # A short fit can end before the worker's replacement executor has registered (seen on
        # CI: a 13 s run of rounds): the cluster is whole again when the replacement has joined.
        executors = wait_for_executors(sc, local_cluster_executors(args.master))
    torch.save(trained.state_dict(), args.out)
    if args.result_sizes:
        results = task_result_sizes(sc, jobs_before)
        print(f"max_task_result_bytes={max(results)}")
        print(f"result_bytes_per_iteration={sum(results) // max(1, args.iterations)}")
    print(f"executors={executors}")
    print(f"iterations={len(opt.summary.iterations)}")
    print(f"validations={[v.metrics for v in opt.summary.validations]}")
    print(f"shards_rebuilt={opt.summary.shards_rebuilt}")
    print(f"placement_misses={opt.summary.placement_misses}")
    print(f"replicas_built={opt.summary.replicas_built}")
    print(f"executors_avoided={opt.summary.executors_avoided}")
    print(f"shard_bytes={opt.summary.shard_bytes}")
    print("task_executors=" + json.dumps([r.executors for r in opt.summary.iterations]))


def main() -> None:
    args = parser().parse_args()
    spark = start_session(args)
    run(spark, args)
    spark.stop()


if __name__ == "__main__":
    main()
