"""G3 (../shared/docs/benchmarks.md): an Optuna study on W2, sparkdl's batched study against
Optuna driving TorchDistributor one trial at a time; the time until the best trial's final
metric is known, each way in a fresh process.

    python bench/optuna_study.py                            # G3: 32 trials, both runners
    python bench/optuna_study.py --trials 8 --epochs 3      # a quick look

The study (the same for both): 32 trials, lr log-uniform 1e-3..0.3, momentum 0..0.95, weight
decay log-uniform 1e-6..1e-2 from a seeded RandomSampler (so both runners try the same
settings), MedianPruner(n_warmup_steps=2): pruning from the end of epoch 2; 10 epochs at most;
the metric is the validation loss after each epoch (2,048 held-out samples of the
training data's classes); an sqlite storage
under a temporary directory for both.

Runners:
  sparkdl           sparkdl.BatchedStudy: trials asked 8 at a time and trained together in one
                    pass (one job per iteration for the batch), the data held once for the
                    study; a pruned trial leaves the pass at its epoch's end
  torchdistributor  study.optimize with an objective that runs TorchDistributor(num_processes=2,
                    local_mode=True) per trial, reading its data from a file; rank 0 reports
                    each epoch's validation loss to the trial through the study's storage and
                    the ranks stop together when the pruner says so (so pruning saves time
                    here too, as with Optuna's TorchDistributedTrial)

Time to best: from the runner's start (before its Spark session) to the moment the best trial
was told (its ``datetime_complete``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_runners import PARTITIONS, SAMPLES, SEED, WORKLOADS, synthetic_data  # noqa: E402
from model_grid import plan, session  # noqa: E402

RUNNERS = ("sparkdl", "torchdistributor")
VALIDATION = 2048
BATCH = 8


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """W2's kind of data: 8,192 training samples and 2,048 held out, of the same classes."""
    x, y = synthetic_data(SAMPLES + VALIDATION)
    return x[:SAMPLES], y[:SAMPLES], x[SAMPLES:], y[SAMPLES:]


def make_study(storage: str) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name="G3", storage=storage, direction="minimize",
        sampler=optuna.samplers.RandomSampler(seed=SEED),
        pruner=optuna.pruners.MedianPruner(n_warmup_steps=2))


def suggest(trial: Any) -> tuple[float, float, float]:
    return (trial.suggest_float("lr", 1e-3, 0.3, log=True),
            trial.suggest_float("momentum", 0.0, 0.95),
            trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True))


def run_sparkdl(study: Any, trials: int, epochs: int) -> None:
    from sparkdl import BatchedStudy, DistriOptimizer
    from sparkdl.metrics import Loss
    from sparkdl.triggers import EveryEpoch, MaxEpoch

    sc = session().sparkContext
    sc.setLogLevel("ERROR")
    workload = WORKLOADS["W2"]
    x, y, vx, vy = data()
    train = sc.parallelize(list(zip(x, y)), PARTITIONS)
    val = sc.parallelize(list(zip(vx, vy)), PARTITIONS)

    def make_fit(trial: Any) -> Any:
        lr, momentum, wd = suggest(trial)
        net = workload.model()
        fit = DistriOptimizer(
            net, train, torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=wd),
            batch_size=workload.batch, end_trigger=MaxEpoch(epochs), seed=SEED,
            progress_bar=False)
        return fit.set_validation(val, EveryEpoch(), [Loss()], batch_size=VALIDATION)

    BatchedStudy(study, make_fit, "Loss", batch_size=BATCH).optimize(trials)
    sc.stop()


def _ddp_trial(path: str, params: tuple[float, float, float], epochs: int, storage: str,
               trial_id: int) -> tuple[list[float], bool]:
    """One trial's training in TorchDistributor's processes; rank 0 reports each epoch's
    validation loss to the trial and the ranks stop together when it is pruned. Returns the
    values and whether it was pruned."""
    import optuna
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = np.load(path)
    xs, ys = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    vx, vy = torch.from_numpy(data["vx"]), torch.from_numpy(data["vy"])
    workload = WORKLOADS["W2"]
    net = DistributedDataParallel(workload.model())
    lr, momentum, wd = params
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    trial = (optuna.Trial(optuna.load_study(study_name="G3", storage=storage), trial_id)
             if rank == 0 else None)
    p, values, pruned = plan(workload.batch), [], False
    for epoch in range(epochs):
        for step in range(p.iterations_per_epoch):
            idx = torch.from_numpy(p.offsets[rank] + p.local_indices(epoch, step, rank))
            opt.zero_grad()
            out = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
            (out * len(idx) / p.batch_size_at(step) * PARTITIONS).backward()
            opt.step()
        said = torch.zeros(2, dtype=torch.float64)     # the validation loss, whether to stop
        if rank == 0:
            with torch.no_grad():
                said[0] = float(torch.nn.functional.cross_entropy(net.module(vx), vy))
            trial.report(float(said[0]), epoch + 1)
            said[1] = float(trial.should_prune())
        dist.broadcast(said, 0)        # every rank returns the values (TorchDistributor
        values.append(float(said[0]))  # returns one rank's result)
        if said[1]:
            pruned = True
            break
    dist.destroy_process_group()
    return values, pruned


def run_torch_distributor(study: Any, trials: int, epochs: int, storage: str) -> None:
    import optuna
    from pyspark.ml.torch.distributor import TorchDistributor

    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.npz")
        x, y, vx, vy = data()
        np.savez(path, x=x, y=y, vx=vx, vy=vy)

        def objective(trial: Any) -> float:
            params = suggest(trial)
            values, pruned = TorchDistributor(num_processes=PARTITIONS, local_mode=True,
                                              use_gpu=False).run(_ddp_trial, path, params,
                                                                 epochs, storage,
                                                                 trial._trial_id)
            if pruned:
                raise optuna.TrialPruned()
            return values[-1]

        study.optimize(objective, n_trials=trials)
    spark.stop()


def one_runner(runner: str, trials: int, epochs: int) -> dict[str, Any]:
    import optuna

    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{os.path.join(tmp, 'study.db')}"
        study = make_study(storage)
        start = datetime.datetime.now()
        t0 = time.perf_counter()
        if runner == "sparkdl":
            run_sparkdl(study, trials, epochs)
        else:
            run_torch_distributor(study, trials, epochs, storage)
        wall = time.perf_counter() - t0
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = min(done, key=lambda t: t.value)
        return {"wall_s": wall,
                "to_best_s": (best.datetime_complete - start).total_seconds(),
                "best": best.number, "best_value": best.value,
                "complete": len(done),
                "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
                "epochs_trained": sum(len(t.intermediate_values) for t in study.trials)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS))
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--one", choices=RUNNERS, help=argparse.SUPPRESS)   # a child process
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_runner(args.one, args.trials, args.epochs)))
        return
    results = {}
    for runner in args.runners:       # each in a fresh process: its startup counts
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--trials",
                               str(args.trials), "--epochs", str(args.epochs), "--one", runner],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{runner} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results[runner] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"G3: an Optuna study of {args.trials} trials on W2, {args.epochs} epochs at most, "
          f"median pruner from epoch 2; sparkdl in batches of {BATCH}")
    print("| runner | time to best s | total s | best trial (loss) | complete | pruned | "
          "epochs trained |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for runner, r in results.items():
        print(f"| {runner} | {r['to_best_s']:.1f} | {r['wall_s']:.1f} | {r['best']} "
              f"({r['best_value']:.4f}) | {r['complete']} | {r['pruned']} | "
              f"{r['epochs_trained']} |")
    if len(results) == 2:
        a, b = results["sparkdl"], results["torchdistributor"]
        print(f"\nsparkdl's speed-up to the best trial: {b['to_best_s'] / a['to_best_s']:.2f}x; "
              f"in total: {b['wall_s'] / a['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
