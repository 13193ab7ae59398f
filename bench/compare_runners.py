"""sparkdl against the alternatives on the reference workloads, in one run, interleaved.

    python bench/compare_runners.py                       # W1 W2 W3, all runners, 3 rounds
    python bench/compare_runners.py --workloads W3 --runners sparkdl single --rounds 1
    python bench/compare_runners.py --cold --workloads W2 --runners sparkdl single torchdistributor
    python bench/compare_runners.py --warm-iterations 500 --rounds 1     # steady state
    python bench/compare_runners.py --workloads W3 --runners sparkdl torchdistributor \
        --rounds 1 --master 'local[2]' 'local-cluster[2,1,2048]' --conf spark.driver.memory=2g

Several ``--master`` values: each master's run in a process of its own, one after the other
(its tables printed as it ends), then one table of them side by side: sparkdl's iteration on
each master, its ratio to the first master's, and sparkdl / TorchDistributor on each (where
TorchDistributor failed on a master, the other masters' median: it runs its ranks on the
driver's machine on any master).

Cold: nothing runs before the timed runs (run one process per workload: what a fresh
spark-submit sees). Otherwise two short sparkdl runs (and ``--warm-iterations`` W1 iterations)
warm the session up first.

Workloads (../shared/docs/benchmarks.md): W1 MLP 784-256-10 at batch 256, W2 LeNet-5 at batch
1024 (and W2-8192 at batch 8192), W3 MLP 784-4096-4096-10 at batch 128; 8192 synthetic
MNIST-shaped samples in 2 partitions, SGD lr 0.01 momentum 0.9, weights from
torch.manual_seed(42), the same batches everywhere (sparkdl's BatchPlan).

Runners: sparkdl (local[2], allreduce="auto"; bf16 compression on W3; the forced paths
sparkdl-shuffle and sparkdl-driver on request), plain PyTorch in one
process with 2 threads, TorchDistributor(num_processes=2, local_mode=True) with DDP over gloo and
one thread per process, a naive Spark loop (state dict broadcast + pickled reduceByKey of
per-parameter gradients), and the bare Spark floor: an empty two-stage PySpark job (map,
reduceByKey, collect) plus a broadcast of the model's byte size.

Bytes floor (with a sparkdl runner, not with ``--cold``): after the rounds, each workload's
gradient bytes are sent through the moves of one iteration with nothing computed
(``bench/bytes_path.py``'s jobs: the broadcast, its reads, the map output, the shuffle, the
reducers' sums, the results), and their hops' sum is printed beside sparkdl's iteration on each
master: what Spark's own transport costs on that master for sparkdl's design (a broadcast and a
shuffle an iteration), which no change inside sparkdl's tasks can go under.

Prints one table: samples/s (median over rounds), ratios to single-process and to
TorchDistributor, first and final loss, peak RSS of the driver-side process and of the workers,
and sparkdl's per-iteration time split with its overhead (iteration minus slowest task compute)
against the floor.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sparkdl.data.batch_plan import BatchPlan  # noqa: E402
from sparkdl.datasets import lenet5, mlp  # noqa: E402
from sparkdl.executor.process_memory import peak_rss_bytes  # noqa: E402

SAMPLES, PARTITIONS, LR, MOMENTUM, SEED = 8192, 2, 0.01, 0.9, 0


@dataclass(frozen=True)
class Workload:
    name: str
    sizes: tuple[int, ...] | None      # MLP widths, None for LeNet-5
    batch: int
    warmup: int
    timed: int

    def model(self) -> torch.nn.Module:
        torch.manual_seed(42)
        return mlp(self.sizes) if self.sizes else lenet5()

    def gradient_bytes(self) -> int:
        return 4 * sum(t.numel() for t in self.model().parameters())


WORKLOADS = {
    "W1": Workload("W1", (784, 256, 10), 256, 30, 60),
    "W2": Workload("W2", None, 1024, 8, 24),
    "W2-8192": Workload("W2-8192", None, 8192, 3, 6),
    "W3": Workload("W3", (784, 4096, 4096, 10), 128, 5, 20),
}


def synthetic_data(n: int = SAMPLES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each class a smooth random prototype plus Gaussian noise (learnable, MNIST-shaped)."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.nn.functional.avg_pool2d(torch.randn(10, 1, 28, 28, generator=g), 5, 1, 2)
    protos = protos / protos.std()
    labels = torch.randint(0, 10, (n,), generator=g)
    x = protos[labels] + 2.0 * torch.randn(n, 1, 28, 28, generator=g)
    return x.numpy().astype(np.float32), labels.numpy().astype(np.int64)


def plan_for(w: Workload) -> BatchPlan:
    return BatchPlan([SAMPLES // PARTITIONS] * PARTITIONS, w.batch, SEED, True)


@dataclass
class Result:
    samples_per_s: float
    first_loss: float
    final_loss: float
    driver_rss: int = 0
    worker_rss: int = 0
    split: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- single process
def _single(w: Workload, x: np.ndarray, y: np.ndarray, queue: Any) -> None:
    torch.set_num_threads(2)
    net, plan = w.model(), plan_for(w)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    xs, ys, losses, start = torch.from_numpy(x), torch.from_numpy(y), [], 0.0
    for t in range(w.warmup + w.timed):
        if t == w.warmup:
            start = time.perf_counter()
        idx = torch.from_numpy(plan.global_indices(*plan.epoch_and_step(t)))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    elapsed = time.perf_counter() - start
    queue.put(Result(w.timed * w.batch / elapsed, losses[0], losses[-1], peak_rss_bytes()))


def run_single(w: Workload, x: np.ndarray, y: np.ndarray, **_: Any) -> Result:
    """In a fresh process, so its peak RSS is its own."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_single, args=(w, x, y, queue))
    proc.start()
    try:
        return queue.get(timeout=3600)
    finally:
        proc.join()


# --------------------------------------------------------------------------- TorchDistributor
def _ddp_train(w: Workload, data_path: str) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = np.load(data_path)
    xs, ys = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    net, plan = DistributedDataParallel(w.model()), plan_for(w)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses, start = [], 0.0
    for t in range(w.warmup + w.timed):
        if t == w.warmup:
            dist.barrier()
            start = time.perf_counter()
        epoch, step = plan.epoch_and_step(t)
        idx = torch.from_numpy(plan.offsets[rank] + plan.local_indices(epoch, step, rank))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        total = torch.tensor([float(loss.detach()) * len(idx)])
        dist.all_reduce(total)
        losses.append(float(total) / plan.batch_size_at(step))
    dist.barrier()
    elapsed = time.perf_counter() - start
    rss = torch.tensor([float(peak_rss_bytes())])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    return {"samples_per_s": w.timed * w.batch / elapsed, "first": losses[0],
            "final": losses[-1], "rss": int(rss)}


TD_TIMEOUT_S = 240


def _descendants(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                children.append(int(entry))
    return children + [d for c in children for d in _descendants(c)]


def _kill_torchrun_after(seconds: float, done: Any) -> None:
    """If TorchDistributor has not returned after ``seconds``, kill the torchrun processes it
    started (a gloo rank sometimes exits and the other waits forever), so run() fails."""
    if done.wait(seconds):
        return
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"torch_run_process_wrapper" in cmd or b"torch.distributed.run" in cmd:
            for victim in [pid] + _descendants(pid):     # the launcher and its ranks
                try:
                    os.kill(victim, 9)
                except OSError:
                    pass
    print(f"TorchDistributor hung for {seconds:.0f} s: its processes were killed",
          file=sys.stderr, flush=True)


def run_torch_distributor(w: Workload, x: np.ndarray, y: np.ndarray, **_: Any) -> Result:
    from pyspark.ml.torch.distributor import TorchDistributor

    done = threading.Event()
    threading.Thread(target=_kill_torchrun_after, args=(TD_TIMEOUT_S, done), daemon=True).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "data.npz")
            np.savez(path, x=x, y=y)
            out = TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                   use_gpu=False).run(_ddp_train, w, path)
    finally:
        done.set()
    return Result(out["samples_per_s"], out["first"], out["final"], worker_rss=out["rss"])


# ----------------------------------------------------------------------------------- sparkdl
def train_sparkdl(w: Workload, x: np.ndarray, y: np.ndarray, sc: Any, iterations: int,
                  **kwargs: Any) -> Any:
    """The DistriOptimizer after ``iterations`` of workload ``w`` (its summary holds the run)."""
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    net = w.model()
    opt = DistriOptimizer(net, sc.parallelize(list(zip(x, y)), PARTITIONS),
                          torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM),
                          batch_size=w.batch, end_trigger=MaxIteration(iterations),
                          seed=SEED, progress_bar=False, **kwargs)
    opt.optimize()
    return opt


class Py4jCounter:
    """Counts the driver's py4j round trips (every command the thread that enters it sends to
    the JVM; not the deletes py4j's finalizer thread sends in bursts about once a second) and
    notes the count each time the runner starts an iteration's jobs: the differences are the
    round trips of one iteration (its jobs, the update, the weights' broadcast)."""

    def __init__(self) -> None:
        self.calls = 0
        self.marks: list[int] = []

    def __enter__(self) -> "Py4jCounter":
        from py4j.clientserver import ClientServerConnection

        from sparkdl.runners.spark_rdd import SparkRddRunner

        self._patched = [(ClientServerConnection, "send_command"),
                         (SparkRddRunner, "gradients_together")]
        self._saved = [getattr(c, n) for c, n in self._patched]
        send, gradients, counter = self._saved[0], self._saved[1], self
        thread = threading.get_ident()

        def counted_send(conn: Any, command: str, *a: Any, **k: Any) -> Any:
            if threading.get_ident() == thread:
                counter.calls += 1
            return send(conn, command, *a, **k)

        def marked_gradients(runner: Any, *a: Any, **k: Any) -> Any:
            counter.marks.append(counter.calls)
            return gradients(runner, *a, **k)

        ClientServerConnection.send_command = counted_send
        SparkRddRunner.gradients_together = marked_gradients
        return self

    def __exit__(self, *exc: Any) -> None:
        for (cls, name), saved in zip(self._patched, self._saved):
            setattr(cls, name, saved)

    def per_iteration(self, first: int) -> float:
        """Median round trips of the iterations from ``first`` on (the last one excluded)."""
        steps = [b - a for a, b in zip(self.marks, self.marks[1:])][first:]
        return float(statistics.median(steps)) if steps else 0.0


def run_sparkdl(w: Workload, x: np.ndarray, y: np.ndarray, sc: Any = None,
                allreduce: str = "auto", compression: str | None = None, **_: Any) -> Result:
    from sparkdl.executor.process_memory import current_rss_bytes

    kwargs = {"allreduce": allreduce}
    if compression:
        kwargs["compression"] = compression
    with Py4jCounter() as counter:
        opt = train_sparkdl(w, x, y, sc, w.warmup + w.timed, **kwargs)
    timed = opt.summary.iterations[w.warmup:]
    split = {k: statistics.median(getattr(r, k) for r in timed)
             for k in ("wall_s", "compute_s", "reduce_s", "update_s", "broadcast_s", "launch_s",
                       "exchange_s", "collect_s", "other_s")}
    split["overhead_s"] = statistics.median(r.wall_s - r.compute_s for r in timed)
    split["py4j_calls"] = counter.per_iteration(w.warmup)
    return Result(sum(r.records for r in timed) / sum(r.wall_s for r in timed),
                  opt.summary.iterations[0].loss, opt.summary.iterations[-1].loss,
                  driver_rss=current_rss_bytes(),
                  worker_rss=max(r.worker_rss_bytes for r in timed), split=split)


# -------------------------------------------------------------------------------- naive loop
def run_naive(w: Workload, x: np.ndarray, y: np.ndarray, sc: Any = None, **_: Any) -> Result:
    """One job per iteration: broadcast the state dict, per-parameter gradients as pickled
    (name, array) records summed by reduceByKey, collected, applied on the driver."""
    net, plan = w.model(), plan_for(w)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    data = sc.parallelize(list(zip(x, y)), PARTITIONS).cache()
    data.count()
    factory = w.model
    losses, start = [], 0.0
    for t in range(w.warmup + w.timed):
        if t == w.warmup:
            start = time.perf_counter()
        epoch, step = plan.epoch_and_step(t)
        local = {p: plan.local_indices(epoch, step, p) for p in range(PARTITIONS)}
        batch = plan.batch_size_at(step)
        state = sc.broadcast({k: v.numpy() for k, v in net.state_dict().items()})

        def grads(p: int, rows: Any, state: Any = state, local: Any = local,
                  batch: int = batch) -> Any:
            torch.set_num_threads(1)
            rows = list(rows)
            model = factory()
            model.load_state_dict({k: torch.from_numpy(v) for k, v in state.value.items()})
            fx = torch.from_numpy(np.stack([rows[i][0] for i in local[p]]))
            fy = torch.tensor([rows[i][1] for i in local[p]])
            loss = torch.nn.functional.cross_entropy(model(fx), fy) * (len(fy) / batch)
            loss.backward()
            yield "__loss__", np.array([float(loss)])
            for name, param in model.named_parameters():
                yield name, param.grad.numpy()

        summed = dict(data.mapPartitionsWithIndex(grads).reduceByKey(np.add).collect())
        state.destroy()
        for name, param in net.named_parameters():
            param.grad = torch.from_numpy(summed[name])
        opt.step()
        losses.append(float(summed["__loss__"][0]))
    elapsed = time.perf_counter() - start
    data.unpersist()
    return Result(w.timed * w.batch / elapsed, losses[0], losses[-1])


# ------------------------------------------------------------------------------------- floor
def spark_floor(sc: Any, nbytes: int, repeats: int = 15) -> tuple[float, float, float, float]:
    """Median seconds of an empty two-stage PySpark job (map, reduceByKey, collect), of
    broadcasting ``nbytes``, of an empty one-stage PySpark job (mapPartitions, collect) and of
    an empty JVM-only job (count; no Python worker), over cached RDDs of ``PARTITIONS``
    partitions."""
    from operator import add

    def _consume(records: Any) -> Any:
        # reads its input to the end (a PySpark worker that stops reading early is not
        # reused, and the next task pays a fresh worker), yields one record
        for _ in records:
            pass
        yield 1

    rdd = sc.parallelize(range(PARTITIONS), PARTITIONS).cache()
    rdd.count()
    jvm_rdd = sc._jsc.parallelize(list(range(PARTITIONS)), PARTITIONS).cache()
    jvm_count = jvm_rdd.count
    jvm_count()
    jobs, casts, ones, jvms = [], [], [], []
    payload = np.zeros(nbytes // 4, dtype=np.float32)
    for _ in range(repeats):
        t0 = time.perf_counter()
        rdd.map(lambda v: (v, 1)).reduceByKey(add, PARTITIONS).collect()
        jobs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bc = sc.broadcast(payload)
        casts.append(time.perf_counter() - t0)
        bc.destroy(blocking=False)
        t0 = time.perf_counter()
        rdd.mapPartitions(_consume).collect()
        ones.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        jvm_count()
        jvms.append(time.perf_counter() - t0)
    rdd.unpersist()
    jvm_rdd.unpersist()
    return (statistics.median(jobs), statistics.median(casts), statistics.median(ones),
            statistics.median(jvms))


RUNNERS = {
    "single": run_single,
    "torchdistributor": run_torch_distributor,
    "sparkdl": run_sparkdl,
    "sparkdl-shuffle": lambda *a, **k: run_sparkdl(*a, **dict(k, allreduce="shuffle")),
    "sparkdl-driver": lambda *a, **k: run_sparkdl(*a, **dict(k, allreduce="driver")),
    "sparkdl-bf16": lambda *a, **k: run_sparkdl(*a, **dict(k, compression="bf16")),
    "naive": run_naive,
}


def fmt_mb(n: int) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--workloads", nargs="+", default=["W1", "W2", "W2-8192", "W3"],
                   choices=list(WORKLOADS))
    p.add_argument("--runners", nargs="+", choices=list(RUNNERS),
                   default=["single", "torchdistributor", "naive", "sparkdl", "sparkdl-bf16"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--master", nargs="+", default=["local[2]"],
                   help="one master, or several: each in a process of its own, then a table of "
                        "them side by side")
    p.add_argument("--summary-json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting for the session (repeatable)")
    p.add_argument("--cold", action="store_true",
                   help="no warm-up before the timed runs: what a fresh spark-submit sees (run "
                        "one process per runner and workload for the cold figures)")
    p.add_argument("--warm-iterations", type=int, default=0,
                   help="train this many W1 iterations with sparkdl before anything is timed "
                        "(steady state: 500)")
    p.add_argument("--spark-log", default="ERROR", metavar="LEVEL",
                   help="the driver's Spark log level (INFO: the jobs' stages and tasks, with "
                        "times; executors' levels come from their log4j2 configuration)")
    args = p.parse_args()
    if len(args.master) > 1:
        if args.summary_json:
            p.error("--summary-json takes one --master")
        compare_masters(args.master)
        return
    args.master = args.master[0]

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sparkdl.spark_settings import spark_session

    conf = {"spark.ui.enabled": "false", **dict(c.split("=", 1) for c in args.conf)}
    spark = spark_session("sparkdl bench: compare runners", args.master, conf)
    sc = spark.sparkContext
    sc.setLogLevel(args.spark_log)
    x, y = synthetic_data()
    # The floor on clean workers, before torch enters them (a reused PySpark worker runs a full
    # gc.collect() after every task, which costs ~60 ms more once torch is imported; sparkdl
    # freezes its long-lived objects out of it, the bare floor jobs later in the session cannot).
    if not args.cold:
        spark_floor(sc, 4, repeats=40)              # Spark's JVM is slow for its first jobs
    clean_floors = {} if args.cold else {
        wname: spark_floor(sc, WORKLOADS[wname].gradient_bytes()) for wname in args.workloads}
    # warm up sparkdl before anything is timed.
    warm = WORKLOADS["W1"]
    for _ in range(0 if args.cold else 2):
        run_sparkdl(Workload("warm", warm.sizes, warm.batch, 20, 1), x, y, sc=sc)
    if args.warm_iterations:
        t0 = time.perf_counter()
        train_sparkdl(warm, x, y, sc, args.warm_iterations)
        print(f"{args.warm_iterations} warm-up iterations of W1 in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    results: dict[tuple[str, str], list[Result]] = {}
    floors: dict[str, list[tuple[float, float, float, float]]] = {}
    for r in range(args.rounds):
        for wname in args.workloads:
            w = WORKLOADS[wname]
            if not args.cold:       # cold: the floor jobs come after, not to warm the JVM
                floors.setdefault(wname, []).append(spark_floor(sc, w.gradient_bytes()))
            for runner in args.runners:
                if runner == "naive" and wname == "W2-8192":
                    continue
                if runner == "sparkdl-bf16" and wname != "W3":
                    continue
                t0 = time.perf_counter()
                try:
                    res = RUNNERS[runner](w, x, y, sc=sc)
                except Exception as exc:  # a runner that fails is reported, not fatal
                    print(f"round {r + 1} {wname:8s} {runner:17s} FAILED: "
                          f"{str(exc).splitlines()[0][:200]}", file=sys.stderr, flush=True)
                    continue
                results.setdefault((wname, runner), []).append(res)
                print(f"round {r + 1} {wname:8s} {runner:17s} {res.samples_per_s:10,.0f} "
                      f"samples/s  loss {res.first_loss:.5f} -> {res.final_loss:.5f}  "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if args.cold:
        for wname in args.workloads:
            floors[wname] = [spark_floor(sc, WORKLOADS[wname].gradient_bytes())]
            clean_floors[wname] = floors[wname][0]
    from bytes_path import bytes_floor  # (it imports scaling_model, which imports this file)

    timed_sparkdl = any(r.startswith("sparkdl") for r in args.runners)   # its only reader
    bytes_floors = {} if args.cold or not timed_sparkdl else {
        wname: bytes_floor(sc, WORKLOADS[wname].gradient_bytes()) for wname in args.workloads}
    report(args, results, floors, clean_floors, bytes_floors)
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary(results, bytes_floors), f)
    spark.stop()


def summary(results: dict[tuple[str, str], list[Result]], bytes_floors: dict[str, float]
            ) -> dict[str, dict[str, Any]]:
    """By workload and runner: the median samples/s, and sparkdl's median iteration in ms; by
    workload under ``"bytes floor"``: its :func:`bytes_floor` in ms."""
    out: dict[str, dict[str, Any]] = {w: {"bytes floor": ms} for w, ms in bytes_floors.items()}
    for (wname, runner), rs in results.items():
        split = [r.split["wall_s"] for r in rs if r.split]
        out.setdefault(wname, {})[runner] = {
            "samples_per_s": statistics.median(r.samples_per_s for r in rs),
            "iteration_ms": 1000 * statistics.median(split) if split else None}
    return out


def compare_masters(masters: list[str]) -> None:
    """This script once per master (the same arguments, that master alone), one after the
    other, then their figures side by side (module docstring)."""
    argv = sys.argv[1:]
    start = argv.index("--master")
    end = start + 1
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    rest = argv[:start] + argv[end:]
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, master in enumerate(masters):
            out = os.path.join(tmp, f"{k}.json")
            print(f"\n## {master}\n", flush=True)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), *rest,
                                   "--master", master, "--summary-json", out])
            if proc.returncode != 0 or not os.path.exists(out):
                print(f"the run on {master} failed (exit code {proc.returncode})", flush=True)
                continue
            with open(out) as f:
                runs[master] = json.load(f)
    print("\nside by side (medians; sparkdl's iteration in ms; the bytes floor: the iteration's "
          "moves of its gradient's bytes through Spark with nothing computed, on that master, "
          "and its ratio to the first master's sparkdl iteration):\n")
    print("| workload | runner | master | iteration | x first master | samples/s | "
          "TorchDistributor samples/s | sparkdl / TD | bytes floor | floor x first master |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    workloads = sorted({w for run in runs.values() for w in run})
    for wname in workloads:
        tds = {m: run[wname]["torchdistributor"]["samples_per_s"] for m, run in runs.items()
               if "torchdistributor" in run.get(wname, {})}
        runners = sorted({r for run in runs.values() for r in run.get(wname, {})
                          if r.startswith("sparkdl")})
        for runner in runners:
            first = runs.get(masters[0], {}).get(wname, {}).get(runner, {}).get("iteration_ms")
            for master in dict.fromkeys(masters):
                fig = runs.get(master, {}).get(wname, {}).get(runner)
                if fig is None:
                    continue
                it = fig["iteration_ms"]
                td = tds.get(master)
                td_note = ""
                if td is None and tds:
                    td, td_note = statistics.median(tds.values()), " (other masters')"
                ratio = f"{fig['samples_per_s'] / td:.2f}" if td else "-"
                floor = runs[master][wname].get("bytes floor")
                print(f"| {wname} | {runner} | `{master}` | "
                      + (f"{it:.1f} | " if it else "- | ")
                      + (f"{it / first:.2f}x | " if it and first else "- | ")
                      + f"{fig['samples_per_s']:,.0f} | "
                      + (f"{td:,.0f}{td_note} | " if td else "- | ") + f"{ratio} | "
                      + (f"{floor:.1f} | " if floor else "- | ")
                      + (f"{floor / first:.2f}x |" if floor and first else "- |"))


def report(args: Any, results: dict[tuple[str, str], list[Result]],
           floors: dict[str, list[tuple[float, float, float, float]]],
           clean_floors: dict[str, tuple[float, float, float, float]],
           bytes_floors: dict[str, float]) -> None:
    print(f"\n{args.rounds} round(s), medians; {args.master}; data {SAMPLES} samples in "
          f"{PARTITIONS} partitions; "
          + ("cold (no warm-up)" if args.cold else
             f"warm-up: 2 short runs + {args.warm_iterations} W1 iterations") + "\n")
    print("| workload | runner | samples/s | x single | x TorchDistributor | first loss | "
          "final loss | driver RSS MiB | worker RSS MiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for wname in args.workloads:
        med = {runner: statistics.median(r.samples_per_s for r in rs)
               for (wn, runner), rs in results.items() if wn == wname}
        for runner in args.runners:
            rs = results.get((wname, runner))
            if not rs:
                continue
            last = rs[-1]
            single = med.get("single")
            td = med.get("torchdistributor")
            print(f"| {wname} | {runner} | {med[runner]:,.0f} | "
                  f"{med[runner] / single:.2f} | " if single else
                  f"| {wname} | {runner} | {med[runner]:,.0f} | - | ", end="")
            print(f"{med[runner] / td:.2f} | " if td else "- | ", end="")
            print(f"{last.first_loss:.5f} | {last.final_loss:.5f} | "
                  f"{fmt_mb(max(r.driver_rss for r in rs))} | "
                  f"{fmt_mb(max(r.worker_rss for r in rs))} |")
    print("\nsparkdl's iteration (medians, ms) against the bare Spark floor (empty two-stage "
          "job + broadcast of the model's size), measured on clean workers before anything "
          "else and again in each round (workers that imported torch):\n")
    print("| workload | runner | iteration | slowest task | launch | exchange | reduce | collect "
          "| update | broadcast | other | overhead | floor, clean workers | overhead / clean "
          "floor | floor in session | overhead / floor in session |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for wname in args.workloads:
        job = statistics.median(f[0] for f in floors[wname])
        cast = statistics.median(f[1] for f in floors[wname])
        for runner in args.runners:
            rs = [r for r in results.get((wname, runner), []) if r.split]
            if not rs:
                continue
            s = {k: 1000 * statistics.median(r.split[k] for r in rs) for k in rs[0].split
                 if k != "py4j_calls"}
            floor = 1000 * (job + cast)
            clean = 1000 * sum(clean_floors[wname][:2])
            print(f"| {wname} | {runner} | {s['wall_s']:.1f} | {s['compute_s']:.1f} | "
                  f"{s['launch_s']:.1f} | {s['exchange_s']:.1f} | {s['reduce_s']:.1f} | "
                  f"{s['collect_s']:.1f} | {s['update_s']:.1f} | {s['broadcast_s']:.1f} | "
                  f"{s['other_s']:.1f} | {s['overhead_s']:.1f} | "
                  f"{1000 * clean_floors[wname][0]:.1f} + {1000 * clean_floors[wname][1]:.1f} | "
                  f"{s['overhead_s'] / clean:.2f} | {1000 * job:.1f} + {1000 * cast:.1f} | "
                  f"{s['overhead_s'] / floor:.2f} |")
    print("\nsparkdl's overhead (iteration minus slowest task, ms) against Spark's one-stage job "
          "floor (an empty mapPartitions + collect over a cached RDD of the same partitions), on "
          "clean workers and in the session, and its py4j round trips per iteration:\n")
    print("| workload | runner | overhead | one-stage floor, clean workers | overhead / clean | "
          "one-stage floor in session | overhead / in session | JVM-only job in session | "
          "py4j round trips |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for wname in args.workloads:
        one = 1000 * statistics.median(f[2] for f in floors[wname])
        jvm = 1000 * statistics.median(f[3] for f in floors[wname])
        clean_one = 1000 * clean_floors[wname][2]
        for runner in args.runners:
            rs = [r for r in results.get((wname, runner), []) if r.split]
            if not rs:
                continue
            overhead = 1000 * statistics.median(r.split["overhead_s"] for r in rs)
            calls = statistics.median(r.split["py4j_calls"] for r in rs)
            print(f"| {wname} | {runner} | {overhead:.1f} | {clean_one:.1f} | "
                  f"{overhead / clean_one:.2f} | {one:.1f} | {overhead / one:.2f} | {jvm:.1f} | "
                  f"{calls:.0f} |")
    if bytes_floors:
        print("\nthe bytes floor: one iteration's moves of the workload's gradient bytes through "
              "Spark with nothing computed (bench/bytes_path.py's hops, medians of 5), beside "
              "sparkdl's iteration:\n")
        print("| workload | bytes floor ms | runner | iteration ms | iteration / floor |")
        print("|---|---:|---|---:|---:|")
        for wname, ms in bytes_floors.items():
            for runner in args.runners:
                rs = [r for r in results.get((wname, runner), []) if r.split]
                if rs:
                    it = 1000 * statistics.median(r.split["wall_s"] for r in rs)
                    print(f"| {wname} | {ms:.1f} | {runner} | {it:.1f} | {it / ms:.2f} |")


if __name__ == "__main__":
    main()
