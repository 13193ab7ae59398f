"""LoRA fine-tuning of a Llama-like base: sparkdl against TorchDistributor + peft, in one run.

    python bench/lora_vs_td.py time                  # the ~100M base, fp32, 2 rounds
    python bench/lora_vs_td.py time --dtype bfloat16 --rounds 3 --local-steps 4 8
    python bench/lora_vs_td.py sweep                 # the largest bf16 base each side trains
    python bench/lora_vs_td.py sweep --sizes 3B 7B 13B --timeout 7200
    python bench/lora_vs_td.py time --size tiny --warmup 4 --timed 4 --rounds 1   # seconds

``time``: the per-iteration median after the warm-up of four runners on ``local[2]``, interleaved
over ``--rounds``: ``sparkdl`` (synchronous SGD, one job per iteration), ``sparkdl-local``
(local rounds of ``--local-steps`` iterations, plain averaging of the deltas),
``td`` (``TorchDistributor(num_processes=2, local_mode=True)``, DDP over the adapters, gloo, one
thread per rank) and ``td-postlocal`` (the same with PyTorch's ``PostLocalSGDOptimizer`` and
``PeriodicModelAverager`` every ``--local-steps`` iterations: TorchDistributor's peer of local
rounds). It prints each runner's milliseconds per iteration, TD's per-iteration time over each
sparkdl runner's (above 1: sparkdl is faster; the targets are 0.8 for ``sparkdl`` against
``td`` and 1.0 for ``sparkdl-local``), first and last loss, and the largest resident set of a
worker (sparkdl's Python workers after a task, TD's ranks after a step) and of sparkdl's driver.

``sweep``: up ``bench/llama_bases.py``'s ladder (100M, 350M, 1B, 3B, 7B, 13B) with a bf16
base, each size saved once and then trained for a few iterations by ``sparkdl`` and by ``td``,
each in a process of its own (``time`` with ``--base``), so that running out of memory ends only
that attempt; a runner that fails a size is not tried on larger ones. Prints every attempt and
the largest base each runner trained.

Both sides take the same data (random token rows, every position counted; labels = the inputs),
the same union batches (sparkdl's ``BatchPlan`` over two partitions, each TD rank its
partition's share, its loss scaled by that share), the same optimizer (AdamW, lr 1e-3, over the
trainable parameters, on each rank for TD and on the driver for sparkdl) and the same adapters
(LoRA r = 8, alpha 16, on ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, created after
``torch.manual_seed(0)``). The base is built from a config with ``torch.manual_seed(0)``, saved
with ``save_pretrained`` into a temporary directory and loaded by every rank and every sparkdl
Python worker with ``from_pretrained`` in ``--dtype``, frozen. One iteration is the time from
the end of one to the end of the next (a round's time over its iterations for the local
runners), so the driver's update and the broadcast of the weights count.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import TD_TIMEOUT_S, _kill_torchrun_after  # noqa: E402
from llama_bases import ATTENTION, CONFIGS, LADDER, parameter_count, save_base  # noqa: E402

from sparkdl.data.batch_plan import BatchPlan  # noqa: E402
from sparkdl.executor.process_memory import current_rss_bytes  # noqa: E402

PARTITIONS, SEED, LR, RANK = 2, 0, 1e-3, 8
RESULT_PREFIX = "LORA_VS_TD_RESULT "
"""Starts the line that a ``time --json`` child prints its results on, for ``sweep``."""


@dataclass(frozen=True)
class Setup:
    """One measurement's base, data and schedule (picklable: it travels to TD's ranks)."""

    base: str           # the directory save_pretrained wrote
    vocab: int
    batch: int          # the union batch, in rows
    seq: int
    warmup: int         # iterations before the timed ones
    timed: int
    dtype: str          # of the base: "float32" or "bfloat16"

    @property
    def iterations(self) -> int:
        return self.warmup + self.timed

    def plan(self) -> BatchPlan:
        """One epoch of exactly ``iterations`` full batches over two equal partitions."""
        rows = self.batch * self.iterations
        return BatchPlan([rows // PARTITIONS] * PARTITIONS, self.batch, SEED, True)

    def tokens(self) -> np.ndarray:
        rng = np.random.default_rng(SEED)
        return rng.integers(1, self.vocab, (self.batch * self.iterations, self.seq)).astype(
            np.int64)


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=ATTENTION)


@dataclass
class Result:
    per_iteration_s: float
    first_loss: float
    last_loss: float
    worker_rss: int = 0
    driver_rss: int = 0
    trainable: int = 0


def per_iteration_s(marks: list[tuple[int, float]], every: int, warmup: int) -> float:
    """Median seconds per iteration after ``warmup`` iterations, from ``marks``: ``(iterations
    done, time)`` at the end of iterations (the first time each count is seen). A turn is
    ``every`` iterations (a local round's, 1 for synchronous SGD): each turn's time, from the
    end of the previous, over its iterations."""
    ends: dict[int, float] = {}
    for done, t in marks:
        ends.setdefault(done, t)
    kept = sorted((d, t) for d, t in ends.items() if d % every == 0 and d >= warmup)
    steps = [(tb - ta) / (db - da) for (da, ta), (db, tb) in zip(kept, kept[1:])]
    if not steps:
        raise ValueError(f"no timed turn of {every} iteration(s) after a warm-up of {warmup}")
    return statistics.median(steps)


def check_schedule(s: Setup, local_steps: int) -> None:
    for name, value in (("--warmup", s.warmup), ("--timed", s.timed)):
        if value % local_steps:
            raise SystemExit(f"{name} {value} must be a multiple of --local-steps {local_steps} "
                             "(whole rounds are timed)")
    if s.warmup < local_steps or s.timed < local_steps:
        raise SystemExit(f"--warmup and --timed must each hold a round of {local_steps}")


# ---------------------------------------------------------------------------------- sparkdl
def run_sparkdl(s: Setup, sc: Any, local_steps: int = 1) -> Result:
    from sparkdl import DistriOptimizer
    from sparkdl.adapters import PretrainedModel, huggingface_step
    from sparkdl.adapters.pretrained import trainable_parameters
    from sparkdl.triggers import MaxIteration, Trigger

    ids = s.tokens()
    records = [((i, np.ones_like(i)), i.copy()) for i in ids]
    rdd = sc.parallelize(records, PARTITIONS)
    marks: list[tuple[int, float]] = []
    stop = MaxIteration(s.iterations)

    class Timing(Trigger):
        def __call__(self, state: Any) -> bool:
            marks.append((state.iteration, time.perf_counter()))
            return stop(state)

    model = PretrainedModel(s.base, "AutoModelForCausalLM", peft_config=lora_config(),
                            dtype=getattr(torch, s.dtype))
    opt = DistriOptimizer(model, rdd, optimizer=lambda p: torch.optim.AdamW(p, lr=LR),
                          batch_size=s.batch, end_trigger=Timing(), seed=SEED,
                          training_step=huggingface_step(("input_ids", "attention_mask")),
                          progress_bar=False, local_steps=local_steps)
    trainable = sum(p.numel() for _, p in trainable_parameters(opt.model))
    opt.optimize()
    rdd.unpersist()
    its = opt.summary.iterations
    return Result(per_iteration_s(marks, local_steps, s.warmup), its[0].loss, its[-1].loss,
                  worker_rss=max(r.worker_rss_bytes for r in its),
                  driver_rss=current_rss_bytes(), trainable=trainable)


# ------------------------------------------------------------------------- TorchDistributor
def _td_train(s: Setup, data_path: str, local_steps: int, postlocal: bool) -> dict[str, Any]:
    import peft
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ids = torch.from_numpy(np.load(data_path)["ids"])
    mask = torch.ones_like(ids)
    base = AutoModelForCausalLM.from_pretrained(s.base, dtype=getattr(torch, s.dtype))
    base.requires_grad_(False)
    torch.manual_seed(SEED)
    model = peft.get_peft_model(base, lora_config())
    net = DistributedDataParallel(model)
    trainable = [p for p in net.parameters() if p.requires_grad]
    count = sum(p.numel() for p in trainable)
    inner = torch.optim.AdamW(trainable, lr=LR)
    opt: Any = inner
    if postlocal:
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        # no gradient averaged (each rank its own subgroup); the models averaged after steps
        # H, 2H, ... as sparkdl's rounds end (the averager averages at its step counts k with
        # k >= warmup_steps and (k - warmup_steps) % H == 0, counting from 0)
        alone, _ = dist.new_subgroups(group_size=1)
        net.register_comm_hook(PostLocalSGDState(None, alone, start_localSGD_iter=0),
                               post_localSGD_hook)
        opt = PostLocalSGDOptimizer(inner, PeriodicModelAverager(local_steps, local_steps - 1))
    plan = s.plan()
    marks: list[tuple[int, float]] = []
    losses, rss = [], 0
    for t in range(s.iterations):
        epoch, step = plan.epoch_and_step(t)
        idx = torch.from_numpy(plan.offsets[rank] + plan.local_indices(epoch, step, rank))
        opt.zero_grad()
        out = net(input_ids=ids[idx], attention_mask=mask[idx], labels=ids[idx])
        (out.loss * (len(idx) * PARTITIONS / plan.batch_size_at(step))).backward()
        opt.step()
        marks.append((t + 1, time.perf_counter()))
        losses.append(float(out.loss.detach()) * len(idx) / plan.batch_size_at(step))
        rss = max(rss, current_rss_bytes())
    summed = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(summed)                       # the union batches' losses, at the end only
    peak = torch.tensor([float(rss)])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    # DDP's reducer dropped while the process group lives: dropped last at the interpreter's
    # exit, its group's destructor waits on gloo threads that wait for the GIL (a hang)
    del net, opt, inner, model, base, out, trainable
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return {"per_iteration_s": per_iteration_s(marks, local_steps if postlocal else 1, s.warmup),
            "first": float(summed[0]), "last": float(summed[-1]), "rss": int(peak),
            "trainable": count}


def run_td(s: Setup, sc: Any = None, local_steps: int = 1, postlocal: bool = False,
           timeout_s: float = 3600) -> Result:
    from pyspark.ml.torch.distributor import TorchDistributor

    done = threading.Event()
    threading.Thread(target=_kill_torchrun_after, args=(max(TD_TIMEOUT_S, timeout_s), done),
                     daemon=True).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "data.npz")
            np.savez(path, ids=s.tokens())
            out = TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                   use_gpu=False).run(_td_train, s, path, local_steps, postlocal)
    finally:
        done.set()
    return Result(out["per_iteration_s"], out["first"], out["last"], worker_rss=out["rss"],
                  trainable=out["trainable"])


RUNNERS: dict[str, Callable[..., Result]] = {
    "sparkdl": lambda s, sc, h: run_sparkdl(s, sc),
    "sparkdl-local": lambda s, sc, h: run_sparkdl(s, sc, local_steps=h),
    "td": lambda s, sc, h: run_td(s, sc),
    "td-postlocal": lambda s, sc, h: run_td(s, sc, local_steps=h, postlocal=True),
}
LOCAL = {"sparkdl-local", "td-postlocal"}
"""The runners whose schedule is rounds of ``--local-steps``."""


# ------------------------------------------------------------------------------------ time
def mib(n: int) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def time_runners(args: argparse.Namespace) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sparkdl.spark_settings import spark_session

    with tempfile.TemporaryDirectory() as root:
        if args.base:
            base, name = args.base, os.path.basename(os.path.normpath(args.base))
        else:
            base, name = save_base(root, args.size, args.dtype, SEED), args.size
        with open(os.path.join(base, "config.json")) as f:
            config = json.load(f)
        s = Setup(base, config["vocab_size"], args.batch, args.seq, args.warmup, args.timed,
                  args.dtype)
        runs = [(r, h) for r in args.runners for h in (args.local_steps if r in LOCAL else [1])]
        for r, h in runs:
            check_schedule(s, h)
        spark = spark_session("sparkdl bench: LoRA against TorchDistributor", args.master,
                              {"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        results: dict[tuple[str, int], list[Result]] = {}
        failed: dict[tuple[str, int], str] = {}
        try:
            for rnd in range(args.rounds):
                for r, h in runs:
                    t0 = time.perf_counter()
                    try:
                        res = RUNNERS[r](s, spark.sparkContext, h)
                    except Exception as exc:    # a runner that fails is reported, not fatal
                        failed[(r, h)] = str(exc).splitlines()[0][:200] if str(exc) else \
                            type(exc).__name__
                        print(f"round {rnd + 1} {r:13s} H={h:<3d} FAILED: {failed[(r, h)]}",
                              file=sys.stderr, flush=True)
                        continue
                    results.setdefault((r, h), []).append(res)
                    print(f"round {rnd + 1} {r:13s} H={h:<3d} "
                          f"{1000 * res.per_iteration_s:9.1f} ms/iteration  loss "
                          f"{res.first_loss:.5f} -> {res.last_loss:.5f}  "
                          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        finally:
            spark.stop()
    if args.json:
        print(RESULT_PREFIX + json.dumps({
            "results": {f"{r}:{h}": [asdict(x) for x in xs] for (r, h), xs in results.items()},
            "failed": {f"{r}:{h}": why for (r, h), why in failed.items()}}), flush=True)
        return
    report_time(args, name, s, results)


def report_time(args: argparse.Namespace, name: str, s: Setup,
                results: dict[tuple[str, int], list[Result]]) -> None:
    med = {k: statistics.median(x.per_iteration_s for x in xs) for k, xs in results.items()}
    td = med.get(("td", 1))
    trainable = next((xs[0].trainable for xs in results.values() if xs[0].trainable), 0)
    total = parameter_count(name) if name in CONFIGS else 0
    share = f", {trainable:,} trainable ({100 * trainable / total:.2f}%)" if total else ""
    print(f"\n{args.rounds} round(s), medians; {args.master}; base {name} "
          f"({total:,} parameters{share}), {s.dtype}, frozen; LoRA r = {RANK} on "
          f"{', '.join(ATTENTION)}; union batch {s.batch} x {s.seq} tokens; {s.warmup} warm-up + "
          f"{s.timed} timed iterations; AdamW lr {LR}\n")
    print("| runner | H | ms / iteration | TD / this | TD post-local (same H) / this | "
          "first loss | last loss | worker RSS MiB | driver RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (r, h), xs in results.items():
        post = med.get(("td-postlocal", h))
        ratio = f"{td / med[(r, h)]:.2f}" if td else "-"
        post_ratio = f"{post / med[(r, h)]:.2f}" if post and r in LOCAL else "-"
        print(f"| {r} | {h} | {1000 * med[(r, h)]:,.1f} | {ratio} | {post_ratio} | "
              f"{xs[-1].first_loss:.5f} | {xs[-1].last_loss:.5f} | "
              f"{mib(max(x.worker_rss for x in xs))} | {mib(max(x.driver_rss for x in xs))} |")
    print("\nTargets (TD's time per iteration over sparkdl's): sparkdl >= 0.8 against td; "
          "sparkdl-local >= 1.0 against td (and shown against td-postlocal at the same H).")


# ----------------------------------------------------------------------------------- sweep
def _save_in_child(root: str, name: str, dtype: str) -> None:
    save_base(root, name, dtype, SEED)


def attempt(args: argparse.Namespace, base: str, runner: str) -> tuple[Result | None, str]:
    """``runner`` on ``base`` in a process of its own: its result, or None and why not."""
    command = [sys.executable, os.path.abspath(__file__), "time", "--base", base, "--runners",
               runner, "--dtype", args.dtype, "--batch", str(args.batch), "--seq",
               str(args.seq), "--warmup", str(args.warmup), "--timed", str(args.timed),
               "--rounds", "1", "--master", args.master, "--json"]
    # a session of its own, so that a timeout ends its JVM, workers and ranks too
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return None, f"ran past {args.timeout:.0f} s"
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if child.returncode or not lines:
        tail = (stderr.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"exit {child.returncode}: {tail}"
    out = json.loads(lines[-1][len(RESULT_PREFIX):])
    runs = out["results"].get(f"{runner}:1")
    if not runs:
        return None, out["failed"].get(f"{runner}:1", "no result")
    return Result(**runs[0]), ""


def sweep(args: argparse.Namespace) -> None:
    alive = list(args.runners)
    largest: dict[str, str] = {}
    rows = []
    for name in args.sizes:
        if not alive:
            break
        with tempfile.TemporaryDirectory(dir=args.scratch) as root:
            ctx = multiprocessing.get_context("spawn")
            saver = ctx.Process(target=_save_in_child, args=(root, name, args.dtype))
            saver.start()
            saver.join()
            if saver.exitcode:
                print(f"{name}: building and saving the base failed (exit {saver.exitcode}); "
                      "the sweep stops here", file=sys.stderr, flush=True)
                break
            for runner in list(alive):
                t0 = time.perf_counter()
                res, why = attempt(args, os.path.join(root, name), runner)
                took = time.perf_counter() - t0
                rows.append((name, runner, res, why))
                print(f"{name:>5} {runner:8s} " + (
                    f"trained: {1000 * res.per_iteration_s:,.0f} ms/iteration, worker RSS "
                    f"{mib(res.worker_rss)} MiB" if res else f"FAILED: {why}") +
                    f"  ({took:.0f} s)", file=sys.stderr, flush=True)
                if res:
                    largest[runner] = name
                else:
                    alive.remove(runner)
    print(f"\n{args.master}; bf16 base frozen, LoRA r = {RANK} on {', '.join(ATTENTION)}; union "
          f"batch {args.batch} x {args.seq} tokens; {args.warmup} + {args.timed} iterations "
          "per attempt, each in a process of its own\n" if args.dtype == "bfloat16" else
          f"\n{args.master}; {args.dtype} base frozen, LoRA r = {RANK}; union batch "
          f"{args.batch} x {args.seq}\n")
    print("| base | parameters | runner | result | ms / iteration | worker RSS MiB |")
    print("|---|---:|---|---|---:|---:|")
    for name, runner, res, why in rows:
        print(f"| {name} | {parameter_count(name):,} | {runner} | "
              + (f"trained | {1000 * res.per_iteration_s:,.0f} | {mib(res.worker_rss)} |"
                 if res else f"failed: {why} | - | - |"))
    print("\nLargest base trained: " + ", ".join(
        f"{r} {largest.get(r, 'none')}" for r in args.runners))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("time", help="per-iteration medians, every runner, interleaved")
    where = t.add_mutually_exclusive_group()
    where.add_argument("--size", default="100M", choices=list(CONFIGS),
                       help="the base to build and save (bench/llama_bases.py)")
    where.add_argument("--base", help="a directory save_pretrained already wrote")
    t.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS))
    t.add_argument("--local-steps", nargs="+", type=int, default=[4],
                   help="H of the local runners (each H is its own run)")
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--warmup", type=int, default=4)
    t.add_argument("--timed", type=int, default=16)
    t.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    t.add_argument("--json", action="store_true", help="one result line (what sweep reads)")
    w = sub.add_parser("sweep", help="the largest base each runner fine-tunes")
    w.add_argument("--sizes", nargs="+", default=LADDER, choices=list(CONFIGS))
    w.add_argument("--runners", nargs="+", choices=["sparkdl", "td"], default=["sparkdl", "td"])
    w.add_argument("--warmup", type=int, default=1)
    w.add_argument("--timed", type=int, default=2)
    w.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    w.add_argument("--timeout", type=float, default=3600, help="seconds per attempt")
    w.add_argument("--scratch", default=None, help="where the bases are saved (default: TMPDIR)")
    for q in (t, w):
        q.add_argument("--batch", type=int, default=8)
        q.add_argument("--seq", type=int, default=128)
        q.add_argument("--master", default="local[2]")
    args = p.parse_args()
    if args.mode == "time":
        time_runners(args)
    else:
        sweep(args)


if __name__ == "__main__":
    main()
