"""Acceptance 2 and 3: bitwise reproducibility, any batch size and partitioning, micro-batches."""

from __future__ import annotations

import pytest
import torch

from models import (SmallNet, ThreadCheckingLoss, bitwise_equal, classification_data, make_rdd,
                    max_abs_diff, reference_train)
from sparkdl import DistriOptimizer
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.triggers import MaxEpoch, MaxIteration


def train(sc, sizes, batch_size, seed=0, iterations=5, **kwargs):
    x, y = classification_data(sum(sizes), seed=1)
    torch.manual_seed(7)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9),
                          batch_size=batch_size, end_trigger=MaxIteration(iterations), seed=seed,
                          **kwargs)
    return opt.optimize(), opt


def test_same_seed_gives_bitwise_identical_weights(sc):
    a, _ = train(sc, [40, 25, 35], 16, seed=5)
    b, _ = train(sc, [40, 25, 35], 16, seed=5)
    assert bitwise_equal(a, b)


def test_different_seed_gives_different_weights(sc):
    a, _ = train(sc, [40, 25, 35], 16, seed=5)
    c, _ = train(sc, [40, 25, 35], 16, seed=6)
    assert not bitwise_equal(a, c)


def test_driver_and_shuffle_allreduce_agree_bitwise(sc):
    a, _ = train(sc, [40, 25, 35], 16, allreduce="shuffle", num_blocks=5)
    b, _ = train(sc, [40, 25, 35], 16, allreduce="driver")
    assert bitwise_equal(a, b)


@pytest.mark.parametrize("sizes,batch", [([50, 50], 7), ([10] * 11, 23), ([33, 1, 66], 1)])
def test_any_batch_size_and_partition_count(sc, sizes, batch):
    trained, opt = train(sc, sizes, batch, iterations=4)
    x, y = classification_data(sum(sizes), seed=1)
    torch.manual_seed(7)
    reference = reference_train(
        SmallNet(), x, y, torch.nn.CrossEntropyLoss(),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9),
        BatchPlan(sizes, batch, 0), 4)
    assert max_abs_diff(trained, reference) <= 1e-5
    assert all(r.records == batch for r in opt.summary.iterations)


def test_micro_batching_gives_the_same_weights(sc):
    plain, _ = train(sc, [60, 40], 50, iterations=4)
    micro, _ = train(sc, [60, 40], 50, iterations=4, micro_batch_size=7)
    assert max_abs_diff(plain, micro) <= 1e-6


def test_max_epoch_counts_full_passes(sc):
    x, y = classification_data(100, seed=1)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [60, 40]),
                          torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                          batch_size=30, end_trigger=MaxEpoch(2))
    opt.optimize()
    assert [r.epoch for r in opt.summary.iterations] == [1] * 4 + [2] * 4
    assert sum(r.records for r in opt.summary.iterations) == 200


def test_tasks_use_spark_task_cpus_threads(sc):
    # local[2] runs tasks with spark.task.cpus=1 while torch would default to 2 threads here.
    x, y = classification_data(40, seed=1)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [20, 20]), ThreadCheckingLoss(1),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=10,
                          end_trigger=MaxIteration(4))
    opt.optimize()
    assert len(opt.summary.iterations) == 4


def test_dropout_is_seeded_per_task(sc):
    from models import DropoutNet
    from sparkdl.data.batch_plan import task_seed

    x, y = classification_data(60, seed=1)

    def run(sizes, seed):
        torch.manual_seed(0)
        net = DropoutNet()
        DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), torch.nn.CrossEntropyLoss(),
                        torch.optim.SGD(net.parameters(), lr=0.2), batch_size=20, seed=seed,
                        end_trigger=MaxIteration(3)).optimize()
        return net

    assert bitwise_equal(run([30, 30], 4), run([30, 30], 4))
    assert not bitwise_equal(run([30, 30], 4), run([30, 30], 5))
    # One partition: single-process PyTorch seeded the same way gives the same weights.
    torch.manual_seed(0)
    ref = DropoutNet()
    sgd = torch.optim.SGD(ref.parameters(), lr=0.2)
    plan = BatchPlan([60], 20, 4)
    for t in range(3):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        torch.manual_seed(task_seed(4, t, 0))
        sgd.zero_grad()
        torch.nn.CrossEntropyLoss()(ref(torch.from_numpy(x[idx])), torch.from_numpy(y[idx])).backward()
        sgd.step()
    assert max_abs_diff(run([60], 4), ref) <= 1e-6


def test_each_partition_is_read_from_the_rdd_once(sc):
    """Iterations use the executor-held shards, never the user's RDD again."""
    x, y = classification_data(90, seed=1)
    reads = sc.accumulator(0)

    def counted(record):
        reads.add(1)
        return record

    rdd = make_rdd(sc, list(zip(x, y)), [50, 40]).map(counted)
    net = SmallNet()
    opt = DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1), batch_size=30,
                          end_trigger=MaxIteration(5))
    opt.optimize()
    assert len(opt.summary.iterations) == 5
    assert reads.value == 90


def test_a_task_seeds_the_cpu_stream_of_torch_manual_seed():
    from sparkdl.executor.step import seed_task

    seed_task(11, "cpu")
    ours = torch.rand(5)
    torch.manual_seed(11)
    assert torch.equal(ours, torch.rand(5))
    seed_task(12, "auto")          # no GPU here: the CPU stream alone, the same
    ours = torch.rand(5)
    torch.manual_seed(12)
    assert torch.equal(ours, torch.rand(5))


def test_a_pass_task_collects_once_for_all_the_replicas_it_makes(monkeypatch):
    import gc
    from sparkdl.executor import worker_cache

    collections = []
    monkeypatch.setattr(worker_cache.gc, "collect", lambda: collections.append(1))
    cache = worker_cache.WorkerCache(capacity=4, freeze=True)
    try:
        with worker_cache.one_freeze():
            for key in range(3):
                cache.put(key, object())
            assert collections == []
        assert collections == [1]
        cache.put(3, object())            # outside the block: at once, as before
        assert collections == [1, 1]
    finally:
        gc.unfreeze()


def test_a_new_replica_leaves_frozen_objects_frozen_and_drops_thaw_then_cleanup_refreezes(
        monkeypatch):
    """A second run's replica collects only what is not frozen (the first replica's objects are
    not walked again: ~0.15 s per task in a worker holding torch); an entry that leaves a cache
    (dropped, or evicted past the capacity) gives the frozen objects back to the collector; the
    cleanup task at a fit's end collects once and freezes what is left."""
    import gc

    from sparkdl.executor import worker_cache
    from sparkdl.executor.replicas import ReplicaSpec, get_replica
    from sparkdl.executor.tasks import CleanupTask

    class Spec:
        value = ReplicaSpec(torch.nn.Linear(3, 2), torch.nn.MSELoss(), "mean")

    thawed = []
    real_unfreeze = gc.unfreeze
    monkeypatch.setattr(worker_cache.gc, "unfreeze", lambda: (thawed.append(1), real_unfreeze()))
    def collected():    # what later collections walk (gc.get_objects omits the frozen)
        return {id(o) for o in gc.get_objects()}

    real_unfreeze()
    try:
        first = get_replica("freeze-a", Spec())
        assert gc.get_freeze_count() > 0 and thawed == []
        assert not {id(first), id(first.model)} & collected()
        second = get_replica("freeze-b", Spec())
        assert second is not first and thawed == []
        # the first replica stayed frozen and the second joined it (the freeze count is no
        # measure: frozen objects freed by their reference count leave the frozen set)
        assert not {id(first), id(first.model), id(second), id(second.model)} & collected()
        del second
        CleanupTask(["freeze-a", "freeze-b"])(iter([]))
        assert thawed == [1, 1]                     # each drop gave the frozen objects back
        assert gc.get_freeze_count() > 0            # and the cleanup froze the survivors again
        cache = worker_cache.WorkerCache(capacity=1, freeze=True)
        cache.put("x", object())
        cache.put("y", object())                    # "x" evicted: the freeze released
        assert thawed == [1, 1, 1] and gc.get_freeze_count() > 0
    finally:
        real_unfreeze()


def test_tasks_without_replicas_freeze_the_imports_once_in_a_spark_worker_only(monkeypatch):
    """Round and hop tasks cache no replica: their first task in a worker freezes what is alive
    (torch's modules), later ones find it frozen and collect nothing; outside a Spark task (the
    driver's in-process runs) nothing is frozen."""
    import gc

    import pyspark

    from sparkdl.executor import worker_cache

    collections = []
    real_collect = gc.collect
    monkeypatch.setattr(worker_cache.gc, "collect", lambda: (collections.append(1), real_collect()))
    gc.unfreeze()
    try:
        worker_cache.freeze_imports_once()
        assert gc.get_freeze_count() == 0 and collections == []
        monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: object()))
        worker_cache.freeze_imports_once()
        assert gc.get_freeze_count() > 0 and collections == [1]
        worker_cache.freeze_imports_once()
        assert collections == [1]
    finally:
        gc.unfreeze()


class _ThreadsSeen(torch.optim.LBFGS):
    """LBFGS that records torch's thread count during each step."""

    seen: list[int] = []

    def step(self, closure):
        _ThreadsSeen.seen.append(torch.get_num_threads())
        return super().step(closure)


def test_the_drivers_update_is_the_same_bits_whatever_its_thread_count():
    """The update runs on one thread (sparkdl.engine.fit.optim.update_threads): an LBFGS fit of
    a 1.5 M
    value model, whose dot products torch splits by thread, ends bitwise the same whether the
    driver has two threads or one (a run resumed on a driver with other cores), and the
    driver's thread count is what it was after the fit."""
    from sparkdl.runners import LocalPartitions

    x, y = classification_data(64, seed=2)
    data = LocalPartitions([list(zip(x[:40], y[:40])), list(zip(x[40:], y[40:]))])
    before = torch.get_num_threads()
    trained = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            torch.manual_seed(3)
            net = torch.nn.Sequential(torch.nn.Linear(6, 1500), torch.nn.Tanh(),
                                      torch.nn.Linear(1500, 1000), torch.nn.Tanh(),
                                      torch.nn.Linear(1000, 3))
            DistriOptimizer(net, data, torch.nn.CrossEntropyLoss(),
                            _ThreadsSeen(net.parameters(), lr=0.5, max_iter=4),
                            batch_size=64, end_trigger=MaxIteration(2), seed=0,
                            progress_bar=False).optimize()
            assert torch.get_num_threads() == threads
            trained.append(net)
    finally:
        torch.set_num_threads(before)
    assert bitwise_equal(*trained)
    assert _ThreadsSeen.seen == [1] * 4
