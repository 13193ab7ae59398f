"""Models, data and the single-process reference used by the tests (importable on executors)."""

from __future__ import annotations

import copy
import os
import signal
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from sparkdl.data.batch_plan import BatchPlan


class SmallNet(nn.Module):
    def __init__(self, d_in: int = 6, hidden: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class TablesNet(nn.Module):
    """Two embedding tables (sparse gradients) and a linear head over their product: a
    recommender-shaped classifier of (user, item) id pairs."""

    def __init__(self, users: int = 40, items: int = 4000, dim: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim, sparse=True)
        self.item = nn.Embedding(items, dim, sparse=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.user(ids[:, 0]) * self.item(ids[:, 1]))


def id_pairs_data(n: int, users: int = 40, items: int = 4000, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(user, item) id pairs and a class each."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, users, n), rng.integers(0, items, n)], 1).astype(np.int64)
    return ids, ((ids[:, 0] + ids[:, 1]) % 3).astype(np.int64)


def tables_optimizer(model: TablesNet) -> Any:
    """SparseAdam for the tables, Adam for the head (an OptimizerSequence)."""
    from sparkdl import OptimizerSequence

    return OptimizerSequence([
        torch.optim.SparseAdam([model.user.weight, model.item.weight], lr=0.05),
        torch.optim.Adam(model.head.parameters(), lr=0.01)])


class TwoInputNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.b = nn.Linear(2, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.a(x) + self.b(z)))


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bn = nn.BatchNorm1d(5)
        self.out = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.fc(x))))


class ThreadCheckingLoss(nn.CrossEntropyLoss):
    """Cross-entropy that fails unless torch uses exactly ``threads`` threads in a task.

    After each check it leaves the worker with a different thread count (as other code in a
    reused Python worker might), so a later task passes only if the engine sets it again.
    """

    def __init__(self, threads: int) -> None:
        super().__init__()
        self.threads = threads

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from pyspark import TaskContext

        if TaskContext.get() is not None:
            if torch.get_num_threads() != self.threads:
                raise RuntimeError(f"torch uses {torch.get_num_threads()} threads in the task, "
                                   f"expected {self.threads}")
            torch.set_num_threads(self.threads + 2)
        return super().forward(output, target)


def classification_data(n: int, d: int = 6, classes: int = 3, seed: int = 0
                        ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, classes))
    y = np.argmax(x @ w + 0.3 * rng.normal(size=(n, classes)), axis=1).astype(np.int64)
    return x, y


def split_sizes(n: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    assert sum(sizes) == n, (sizes, n)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(len(sizes))]


def make_rdd(sc: Any, records: list[Any], sizes: Sequence[int]) -> Any:
    """An RDD whose partition i holds the next ``sizes[i]`` records, in order."""
    spans = split_sizes(len(records), sizes)
    parts = [records[a:b] for a, b in spans]
    return sc.parallelize(range(len(parts)), len(parts)).mapPartitionsWithIndex(
        lambda i, _: iter(parts[i]))


def reference_train(model: nn.Module, x: Any, y: np.ndarray, criterion: Any,
                    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
                    plan: BatchPlan, iterations: int,
                    make_scheduler: Callable[[Any], Any] | None = None,
                    scheduler_step: str = "epoch") -> nn.Module:
    """Plain single-process PyTorch on the same union batches as the engine."""
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model)
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    inputs = x if isinstance(x, tuple) else (x,)
    for t in range(iterations):
        epoch, step = plan.epoch_and_step(t)
        idx = plan.global_indices(epoch, step)
        optimizer.zero_grad()
        out = model(*[torch.from_numpy(a[idx]) for a in inputs])
        criterion(out, torch.from_numpy(y[idx])).backward()
        optimizer.step()
        if scheduler is not None and (scheduler_step == "iteration"
                                      or step == plan.iterations_per_epoch - 1):
            scheduler.step()
    return model


def hop_reference(model: nn.Module, optimizer: torch.optim.Optimizer,
                  partitions: Sequence[tuple[np.ndarray, np.ndarray]], criterion: Any,
                  batch_size: int, seed: int, epochs: int, position: int, hop_seed: int = 0,
                  scheduler: Any = None, shuffle: bool = True,
                  scheduler_per_epoch: bool = False) -> nn.Module:
    """Plain single-process PyTorch as model hopping defines a model
    (sparkdl.engine.strategies.hop.jobs):
    the partitions in the model's visiting order, each partition's samples in its epoch order,
    one optimizer step (and, if given, one scheduler step) per batch, or with
    ``scheduler_per_epoch`` one scheduler step per epoch. Trains ``model`` in place and returns
    it."""
    from sparkdl.data.batch_plan import local_permutation
    from sparkdl.engine.strategies.hop.order import visiting_order

    for epoch in range(epochs):
        for p in visiting_order(hop_seed, epoch, position, len(partitions)):
            xs, ys = partitions[p]
            order = local_permutation(len(ys), seed, epoch, p, shuffle)
            for start in range(0, len(ys), batch_size):
                idx = order[start:start + batch_size]
                optimizer.zero_grad()
                criterion(model(torch.from_numpy(xs[idx])), torch.from_numpy(ys[idx])).backward()
                optimizer.step()
                if scheduler is not None and not scheduler_per_epoch:
                    scheduler.step()
        if scheduler is not None and scheduler_per_epoch:
            scheduler.step()
    return model


def max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa)


class JobCounter:
    """Counts the Spark jobs this thread starts inside a ``with`` block, through a job group of
    its own (the status tracker's list of all jobs drops the oldest past
    ``spark.ui.retainedJobs``, so differences of its length break in a long session)."""

    def __init__(self, sc: Any) -> None:
        import uuid

        self.sc, self.group = sc, f"sparkdl-test-{uuid.uuid4().hex}"

    def __enter__(self) -> "JobCounter":
        self.sc.setJobGroup(self.group, "jobs counted by a test")
        return self

    def __exit__(self, *exc: Any) -> None:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            self.sc.setLocalProperty(key, None)

    @property
    def count(self) -> int:
        return len(self.sc.statusTracker().getJobIdsForGroup(self.group))


def bitwise_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _claim_once(marker: str) -> bool:
    """True for exactly one caller across all processes of this machine (creates ``marker``)."""
    import os

    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class FaultInjectingLoss(nn.CrossEntropyLoss):
    """Cross-entropy that injects one fault in a task, at its ``at_call``-th call in a worker.

    ``fault`` is "task" (raise on the task's first attempt only), "worker" (SIGKILL the Python
    worker that runs the task: the retry runs in a new one), "executor" (SIGKILL the
    executor JVM that runs the task) or "executor-validation" (the same, in a validation task:
    the criterion runs there for the Loss metric, without autograd). ``marker`` makes it happen
    once per run.
    """

    def __init__(self, fault: str, marker: str, at_call: int = 3) -> None:
        super().__init__()
        self.fault, self.marker, self.at_call = fault, marker, at_call
        self.calls = 0

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        in_validation = not torch.is_grad_enabled()
        if ctx is not None and in_validation == (self.fault == "executor-validation"):
            self.calls += 1
            if (self.calls >= self.at_call and ctx.attemptNumber() == 0
                    and _claim_once(self.marker)):
                if self.fault == "task":
                    raise RuntimeError("injected task failure (first attempt)")
                if self.fault == "worker":
                    os.kill(os.getpid(), signal.SIGKILL)
                _kill_executor_jvm()
        return super().forward(output, target)


class SlowPartitionLoss(nn.CrossEntropyLoss):
    """Cross-entropy that makes one partition's training tasks ``seconds`` slower (a
    straggler): with ``spark.locality.wait=0`` the other tasks then run wherever a slot is free.
    ``partition=-1``: every partition's (a backlog of tasks, for dynamic allocation)."""

    def __init__(self, partition: int, seconds: float = 0.4) -> None:
        super().__init__()
        self.partition, self.seconds = partition, seconds

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and torch.is_grad_enabled() and \
                self.partition in (-1, ctx.partitionId()):
            time.sleep(self.seconds)
        return super().forward(output, target)


class SlowExecutorLoss(nn.CrossEntropyLoss):
    """Cross-entropy that makes every training task on one executor ``seconds`` slower (a slow
    machine): the one whose working directory lies under a directory named ``worker``."""

    def __init__(self, worker: str, seconds: float = 1.5) -> None:
        super().__init__()
        self.worker, self.seconds = worker, seconds

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import os
        import time

        if torch.is_grad_enabled() and f"/{self.worker}/" in os.getcwd() + "/":
            time.sleep(self.seconds)
        return super().forward(output, target)


def kill_driver_after_first_checkpoint(cmd: list[str], checkpoint_dir: Any,
                                       timeout: float = 300) -> None:
    """Start a driver process (``cmd``), wait until a ``checkpoint-*`` file appears in
    ``checkpoint_dir`` (or below it) and SIGKILL the driver's whole process group; fail if it ended first."""
    import os
    import signal
    import subprocess
    import time

    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and first.poll() is None:
            if any(f.startswith("checkpoint-") for _, _, files in os.walk(checkpoint_dir)
                   for f in files):     # the directory, or a fit's subdirectory in it
                break
            time.sleep(0.05)
        assert first.poll() is None, "the first driver ended before it could be killed"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)


def _kill_executor_jvm() -> None:
    import os
    import signal

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                os.kill(pid, signal.SIGKILL)
                os._exit(1)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no executor JVM among this worker's ancestors")


class AddressRecordingLoss(nn.CrossEntropyLoss):
    """Cross-entropy that leaves a marker file naming the executor process and the GPU
    addresses Spark gave the task (``none`` without), in ``directory``."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import os

        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            gpu = ctx.resources().get("gpu")
            addresses = "-".join(gpu.addresses) if gpu is not None else "none"
            name = f"executor-{os.getppid()}-gpu-{addresses}"
            open(os.path.join(self.directory, name), "w").close()
        return super().forward(output, target)


class ShardDroppingLoss(nn.CrossEntropyLoss):
    """Cross-entropy that, once per run (``marker``), deletes this executor's shard files and
    forgets the worker's cached shards at its ``at_call``-th call: later tasks in this worker
    find no shard and have it built again where they run, from the RDD lineage."""

    def __init__(self, marker: str, at_call: int = 2) -> None:
        super().__init__()
        self.marker, self.at_call, self.calls = marker, at_call, 0

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import shutil

        from pyspark import TaskContext

        if TaskContext.get() is not None:
            self.calls += 1
            if self.calls >= self.at_call and _claim_once(self.marker):
                from sparkdl.executor import shard_store

                for key in shard_store._SHARDS.keys():
                    shard_store._SHARDS.pop(key)
                shutil.rmtree(shard_store.shard_root(), ignore_errors=True)
        return super().forward(output, target)
