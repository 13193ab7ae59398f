"""Large models on local[2]: per-iteration time against model size, and the largest model that
trains, for sparkdl sync, sparkdl rounds (H = 16) and TorchDistributor (2 gloo ranks, DDP), at a
given driver heap (issue "Large models"); ``--optimizer adam`` puts Adam inside every runner,
``--master`` runs sparkdl on another master (``local-cluster[...]``: executors of their own).

Every measurement runs in a process of its own (its own JVM, with ``spark.driver.memory`` set to
``--heap`` and Spark's default ``spark.driver.maxResultSize``), under a time limit; a run that
fails prints why (the sparkdl error's class, or the time limit). Models:

* ``mlp``: 256 -> hidden -> 256 (ReLU), MSE on random data, SGD (lr 1e-3); about 512 x hidden
  parameters. Global batch 64.
* ``transformer``: a GPT-2 from a ``transformers`` config (n_embd 1024, 16 heads, vocabulary
  8192, 64 tokens), the number of layers setting the size; next-token cross-entropy, SGD.
  Global batch 8 sequences.

A sync run also shows where its iteration goes (compute, launch, exchange and reduce,
collect, update and broadcast: medians after the first two iterations), and with ``--floor``
the bytes floor of its vector, measured in the same session after the fit
(``bench/bytes_path.py``: one iteration's moves of that many bytes through Spark with nothing
computed), which no change in sparkdl's tasks can go under on that master.

Per-iteration time: the median gap between consecutive iterations after the first two (rounds:
the median of rounds 2 to ``--rounds`` (4) times over their H iterations; ``largest`` probes
of large models use ``--rounds 2``). Samples per second: the global batch over it.
Each run's peak memory (the machine's, sampled) is reported beside it, with its processes'
resident memory at that moment (the driver's Python process, the Python workers, the JVMs;
resident sizes count the shared libraries, torch's among them, in each process).

    python bench/large_models.py curve --heap 2g --sizes 20 80 300 --runners sync rounds td
    python bench/large_models.py largest --heap 2g --kind mlp --runners sync rounds td \\
        --sizes 300 450 600 800
    python bench/large_models.py equal --millions 303 --heap 2g   # the issue's target
    python bench/large_models.py equal --millions 294 --heap 2g --momentum 0.9 \\
        --master 'local-cluster[2,1,2048]'                         # on executors of their own
    python bench/large_models.py largest --heap 2g --kind mlp --optimizer adam \\
        --runners rounds td --sizes 200 300 400 --rounds 2        # Adam inside
    python bench/large_models.py curve --heap 2g --sizes 80 --runners sync td \\
        --master 'local[2]' 'local-cluster[2,1,2048]'              # both masters, one run
    python bench/large_models.py curve --heap 2g --sizes 80 --runners sync --floor \\
        --master 'local-cluster[2,1,2048]' --conf spark.executor.memory=2g  # Spark's own cost
    python bench/large_models.py curve --runners rounds --sizes 300 --optimizer adam \\
        --heap 2g --rounds 2 --master 'local-cluster[2,1,2048]' \\
        --conf spark.executor.memory=2g                            # on executors of their own
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PARTITIONS = 2
LOCAL_STEPS = 16
D = 256
VOCAB, SEQ, EMBD = 8192, 64, 1024


def make_model(kind: str, millions: float) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        hidden = int(millions * 1e6 / (2 * D))
        return nn.Sequential(nn.Linear(D, hidden), nn.ReLU(), nn.Linear(hidden, D))
    from transformers import GPT2Config, GPT2LMHeadModel

    per_layer = 12 * EMBD * EMBD
    layers = max(1, round((millions * 1e6 - VOCAB * EMBD) / per_layer))
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=EMBD, n_layer=layers,
                        n_head=16, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = GPT2LMHeadModel(config)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=ids).logits.reshape(-1, VOCAB)

    return Logits()


def batch_and_data(kind: str) -> tuple[int, np.ndarray, np.ndarray]:
    """The global batch and the data: two rounds of H iterations per epoch (a round never
    crosses an epoch's end, so fewer would cut H)."""
    rng = np.random.default_rng(1)
    if kind == "mlp":
        x = rng.standard_normal((64 * 2 * LOCAL_STEPS, D)).astype(np.float32)
        return 64, x, (0.5 * x).astype(np.float32)
    ids = rng.integers(0, VOCAB, (8 * 2 * LOCAL_STEPS, SEQ + 1))
    return 8, ids[:, :-1].astype(np.int64), ids[:, 1:].astype(np.int64)


def criterion(kind: str) -> Any:
    if kind == "mlp":
        return nn.MSELoss()
    return lambda logits, y: nn.functional.cross_entropy(logits, y.reshape(-1))


def make_optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    """``sgd`` (lr 1e-3, no state) or ``adam`` (lr 1e-4: two state tensors per parameter)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.SGD(params, lr=1e-3)


def per_iteration(stamps: list[float], per: int = 1) -> float:
    gaps = [(b - a) / per for a, b in zip(stamps[1:], stamps[2:])] or \
        [(stamps[-1] - stamps[0]) / per]
    return statistics.median(gaps)


# ------------------------------------------------------------------------------ one measurement
def measure_sparkdl(args: Any) -> dict[str, Any]:
    from sparkdl import DistriOptimizer
    from sparkdl.spark_settings import spark_session
    from sparkdl.triggers import MaxIteration, Trigger

    spark = spark_session("large models", args.master, {"spark.driver.memory": args.heap,
                                                         "spark.ui.enabled": "false",
                                                         **dict(c.split("=", 1)
                                                                for c in args.conf)})
    spark.sparkContext.setLogLevel("OFF")
    batch, x, y = batch_and_data(args.kind)
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), PARTITIONS)
    model = make_model(args.kind, args.millions)
    rounds = args.runner == "rounds"
    iterations = args.rounds * LOCAL_STEPS if rounds else args.iterations
    stamps: list[float] = []
    marks: list[tuple[int, float]] = []        # (iteration, when the trigger first saw it)

    class Stamp(Trigger):
        def __call__(self, state: Any) -> bool:
            if not marks or marks[-1][0] != state.iteration:
                marks.append((state.iteration, time.perf_counter()))
                stamps.append(marks[-1][1])
            return MaxIteration(iterations)(state)

    fit = DistriOptimizer(model, rdd, criterion(args.kind),
                          make_optimizer(args.optimizer, model.parameters()), batch_size=batch,
                          end_trigger=Stamp(), seed=1, progress_bar=False,
                          local_steps=LOCAL_STEPS if rounds else 1,
                          outer_optimizer="average" if rounds else None)
    fit.optimize()
    if rounds:       # the trigger sees a round's iterations at its end: rounds 2-N's median
        ends = [(it, t) for k, (it, t) in enumerate(marks)
                if k + 1 == len(marks) or marks[k + 1][1] - t > 1e-3]
        seconds = statistics.median((t1 - t0) / (i1 - i0)
                                    for (i0, t0), (i1, t1) in zip(ends[:-1], ends[1:]))
    else:
        seconds = per_iteration(stamps)
    row = {"per_iteration_s": seconds, "samples_per_s": batch / seconds}
    if not rounds:       # where a sync iteration goes, and what Spark's moves of it cost alone
        timed = fit.summary.iterations[2:] or fit.summary.iterations
        row["split_s"] = {part: statistics.median(sum(getattr(r, k) for k in keys)
                                                  for r in timed)
                          for part, keys in SPLIT.items()}
        if args.floor:
            from bytes_path import bytes_floor
            vector = 4 * sum(t.numel() for t in model.parameters())
            row["floor_s"] = bytes_floor(spark.sparkContext, vector, repeats=3) / 1000
    spark.stop()
    return row


SPLIT = {"compute": ("compute_s",), "launch": ("launch_s",),
         "exchange + reduce": ("exchange_s", "reduce_s"), "collect": ("collect_s",),
         "update + broadcast": ("update_s", "broadcast_s")}
"""A sync iteration's parts (:class:`sparkdl.engine.fit.reports.summary.IterationRecord`'s
fields), medians over the iterations after the first two."""


def _ddp(kind: str, millions: float, iterations: int, path: str,
         optimizer: str = "sgd") -> list[float]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = np.load(path)
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    net = DistributedDataParallel(make_model(kind, millions))
    opt = make_optimizer(optimizer, net.parameters())
    loss_fn = criterion(kind)
    local = int(data["batch"]) // PARTITIONS
    stamps = []
    for t in range(iterations):
        lo = (t * PARTITIONS + rank) * local % len(x)
        opt.zero_grad()
        loss_fn(net(x[lo:lo + local]), y[lo:lo + local]).backward()
        opt.step()
        stamps.append(time.perf_counter())
    del net, opt       # DDP's reducer dropped before its process group (else a rank may hang)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return stamps


def measure_td(args: Any) -> dict[str, Any]:
    from pyspark.ml.torch.distributor import TorchDistributor
    from sparkdl.spark_settings import spark_session

    spark = spark_session("large models (TorchDistributor)", "local[2]",
                          {"spark.driver.memory": args.heap, "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("OFF")
    batch, x, y = batch_and_data(args.kind)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.npz")
        np.savez(path, x=x, y=y, batch=batch)
        stamps = TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                  use_gpu=False).run(_ddp, args.kind, args.millions,
                                                     args.iterations, path, args.optimizer)
    seconds = per_iteration(stamps)
    return {"per_iteration_s": seconds, "samples_per_s": batch / seconds}


def measure(args: Any) -> None:
    started = time.perf_counter()
    try:
        row = (measure_td if args.runner == "td" else measure_sparkdl)(args)
        row["ok"] = True
    except Exception as exc:
        row = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    row["wall_s"] = time.perf_counter() - started
    print("RESULT " + json.dumps(row), flush=True)
    os._exit(0)       # TorchDistributor's gloo ranks may leave threads behind


def _available_gib() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def _session_rss(session: int) -> dict[str, list[float]]:
    """The resident memory (GiB) of each process in ``session`` (the measurement's), by what it
    is: the driver's Python process, the Python workers (with their daemons), the driver's
    JVM and the executors' JVMs. Resident sizes count the shared libraries in every process."""
    found: dict[str, list[float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[3]) != session:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/status") as f:
                rss = next((int(line.split()[1]) for line in f if line.startswith("VmRSS")), 0)
        except (OSError, ValueError, IndexError):
            continue                     # gone meanwhile, or a kernel thread
        if "CoarseGrainedExecutorBackend" in cmd:
            what = "executor JVMs"
        elif "java" in cmd.split(" ", 1)[0]:
            what = "driver JVM"
        elif "pyspark.daemon" in cmd or "pyspark/daemon" in cmd:
            what = "Python workers"
        elif int(pid) == session:
            what = "driver Python"
        else:
            what = "other"
        if rss > 64 << 10:               # (the daemons' idle forks and helpers left out)
            found.setdefault(what, []).append(rss / 2**20)
    return found


def describe_processes(found: dict[str, list[float]]) -> str:
    """``_session_rss``'s figures as one table cell."""
    order = ["driver Python", "Python workers", "driver JVM", "executor JVMs", "other"]
    return "; ".join(f"{what} " + " + ".join(f"{g:.1f}" for g in sorted(found[what],
                                                                       reverse=True))
                     for what in order if found.get(what))


def run_one(runner: str, kind: str, millions: float, heap: str, iterations: int,
            timeout: float, rounds: int = 4, optimizer: str = "sgd",
            master: str = "local[2]", conf: list[str] | None = None,
            floor: bool = False) -> dict[str, Any]:
    """One measurement in a process of its own; ``peak_gib``: the most memory the machine had in
    use beyond what it had before the run (sampled every 0.2 s); ``at_peak``: its processes'
    resident memory at that moment (:func:`describe_processes`)."""
    cmd = [sys.executable, os.path.abspath(__file__), "measure", "--runner", runner, "--kind",
           kind, "--millions", str(millions), "--heap", heap, "--iterations", str(iterations),
           "--rounds", str(rounds), "--optimizer", optimizer, "--master", master,
           *[a for c in conf or [] for a in ("--conf", c)], *(["--floor"] if floor else [])]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    before = _available_gib()
    lowest = before
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env,
                                start_new_session=True)
        deadline = time.time() + timeout
        at_peak = ""
        while proc.poll() is None and time.time() < deadline:
            available = _available_gib()
            if available < lowest:
                lowest = available
                at_peak = describe_processes(_session_rss(proc.pid))
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
            subprocess.run(["pkill", "-9", "-f", "torch.distributed.run"], check=False)
            return {"ok": False, "error": f"no result in {timeout:.0f} s",
                    "peak_gib": before - lowest, "at_peak": at_peak}
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"ok": False, "error": f"exit {proc.returncode}: "
                                      f"{(stderr.strip().splitlines() or [''])[-1][:200]}",
                "peak_gib": before - lowest, "at_peak": at_peak}
    row = json.loads(lines[-1][7:])
    row.update(peak_gib=before - lowest, at_peak=at_peak)
    return row


def show(rows: list[dict[str, Any]]) -> None:
    print("| runner | master | model | M params | heap | per iteration (s) | of which (s): "
          + " / ".join(SPLIT) + " | bytes floor (s) | samples/s | peak GiB | outcome | "
          "resident GiB at the peak |")
    print("|---|---|---|---:|---|---:|---|---:|---:|---:|---|---|")
    for r in rows:
        head = (f"| {r['runner']} | {r['master']} | {r['kind']} | {r['millions']:g} | "
                f"{r['heap']} | ")
        peak = f"{r.get('peak_gib', 0):.1f}"
        at = r.get("at_peak", "")
        split = " / ".join(f"{v:.2f}" for v in r["split_s"].values()) if r.get("split_s") \
            else "-"
        floor = f"{r['floor_s']:.2f}" if r.get("floor_s") else "-"
        if r["ok"]:
            print(head + f"{r['per_iteration_s']:.2f} | {split} | {floor} | "
                  f"{r['samples_per_s']:.1f} | {peak} | trains | {at} |", flush=True)
        else:
            print(head + f"- | - | - | - | {peak} | {r['error']} | {at} |", flush=True)


def sweep(args: Any, stop_at_failure: bool) -> None:
    """Every runner at every size, each in a process of its own; sparkdl's runners on every
    ``--master`` in turn, TorchDistributor once (its ranks run on the driver's machine)."""
    rows = []
    for runner in args.runners:
        for master in args.master if runner != "td" else ["driver's machine"]:
            for millions in args.sizes:
                row = run_one(runner, args.kind, millions, args.heap, args.iterations,
                              args.timeout, args.rounds, args.optimizer,
                              args.master[0] if runner == "td" else master, args.conf,
                              args.floor and runner == "sync")
                row.update(runner=runner, kind=args.kind, millions=millions, heap=args.heap,
                           master=master)
                rows.append(row)
                show([row])
                if stop_at_failure and not row["ok"]:
                    break
    print()
    show(rows)


def equal(args: Any) -> None:
    """The issue's target: the MLP of ``--millions`` trained for 3 iterations of sparkdl sync
    (SGD, with ``--momentum``) on ``--master`` with ``--heap``, the ``--conf`` settings and
    Spark's default maxResultSize, then plain single-process torch on the same union batches;
    prints the largest difference."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from models import max_abs_diff, reference_train
    from sparkdl import DistriOptimizer
    from sparkdl.data.batch_plan import BatchPlan
    from sparkdl.spark_settings import spark_session
    from sparkdl.triggers import MaxIteration

    spark = spark_session("large models (equal)", args.master,
                          {"spark.driver.memory": args.heap, "spark.ui.enabled": "false",
                           **dict(c.split("=", 1) for c in args.conf)})
    spark.sparkContext.setLogLevel("OFF")
    batch, x, y = batch_and_data("mlp")
    sizes = [len(x) // PARTITIONS] * PARTITIONS
    from models import make_rdd

    rdd = make_rdd(spark.sparkContext, list(zip(x, y)), sizes)
    model = make_model("mlp", args.millions)
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    started = time.perf_counter()
    DistriOptimizer(model, rdd, nn.MSELoss(),
                    torch.optim.SGD(model.parameters(), lr=1e-3, momentum=args.momentum),
                    batch_size=batch, end_trigger=MaxIteration(3), seed=1,
                    progress_bar=False).optimize()
    seconds = time.perf_counter() - started
    spark.stop()
    reference = make_model("mlp", args.millions)
    reference.load_state_dict(initial_state)
    del initial_state
    expected = reference_train(reference, x, y, nn.MSELoss(),
                               lambda m: torch.optim.SGD(m.parameters(), lr=1e-3,
                                                         momentum=args.momentum),
                               BatchPlan(sizes, batch, 1), 3)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.1f} M parameters on {args.master}, heap {args.heap}, momentum "
          f"{args.momentum}: 3 iterations in {seconds:.0f} s, "
          f"largest difference from single-process torch {max_abs_diff(model, expected):.3g}, "
          f"largest change {max_abs_diff(model, reference):.3g}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["curve", "largest", "measure", "equal"])
    p.add_argument("--runner", default="sync")
    p.add_argument("--runners", nargs="+", default=["sync", "rounds", "td"])
    p.add_argument("--kind", default="mlp", choices=["mlp", "transformer"])
    p.add_argument("--millions", type=float, default=20)
    p.add_argument("--sizes", type=float, nargs="+", default=[20, 80, 300])
    p.add_argument("--heap", default="2g")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds of a rounds fit (its time: the median of rounds 2 to N)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"],
                   help="inside every runner (rounds: inside the rounds, averaged outside)")
    p.add_argument("--momentum", type=float, default=0.0, help="equal: SGD's momentum")
    p.add_argument("--master", nargs="+", default=["local[2]"],
                   help="sparkdl's master, e.g. local-cluster[2,1,2048] (TorchDistributor's "
                        "ranks always run on the driver's machine); curve and largest take "
                        "several, one after the other")
    p.add_argument("--conf", action="append", default=[],
                   help="KEY=VALUE, a Spark setting of sparkdl's session")
    p.add_argument("--floor", action="store_true",
                   help="sync runs: after the fit, in its session, the bytes floor of its "
                        "vector (bench/bytes_path.py: one iteration's moves through Spark with "
                        "nothing computed, medians of 3)")
    args = p.parse_args()
    if args.command in ("measure", "equal"):
        if len(args.master) > 1:
            p.error(f"{args.command} takes one --master")
        args.master = args.master[0]
    if args.command == "measure":
        measure(args)
    elif args.command == "equal":
        equal(args)
    else:
        sweep(args, stop_at_failure=args.command == "largest")


if __name__ == "__main__":
    main()
