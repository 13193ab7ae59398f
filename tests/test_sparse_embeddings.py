"""Recommender scale (issue 23): embedding tables with sparse gradients travel as the rows a
batch touched, summed in partition order, and train like single-process PyTorch; several
optimizers (SparseAdam for the tables, Adam for the rest) checkpoint and resume as one; an
optimizer that cannot take sparse gradients is refused before any Spark job."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from torch import nn

from models import JobCounter, bitwise_equal, make_rdd, max_abs_diff, reference_train
from sparkdl import BatchPlan, DistriOptimizer, InvalidArgumentError, OptimizerSequence
from sparkdl.engine.fit.optim.optimizer_sequence import optimizer_members
from sparkdl.data.ragged import Ragged
from sparkdl.runners import LocalPartitions
from sparkdl.transport.flat_layout import ParamLayout
from sparkdl.transport.table_rows import dense_grad, dense_rows, split_rows, sum_rows
from sparkdl.triggers import MaxIteration, SeveralIteration

SIZES, BATCH, SEED, ITERATIONS = [90, 40, 130, 60], 48, 11, 12
USERS, ITEMS = 70, 500        # most items are never touched by a 12-iteration run


class TwoTower(nn.Module):
    """User and item tables (sparse gradients) and a small dense head over their product."""

    def __init__(self, sparse: bool = True) -> None:
        super().__init__()
        self.user = nn.Embedding(USERS, 8, sparse=sparse)
        self.item = nn.Embedding(ITEMS, 8, sparse=sparse)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.user(ids[:, 0]) * self.item(ids[:, 1])).squeeze(-1)


class BagNet(nn.Module):
    """An EmbeddingBag over each row's variable-length ids (flat ids plus offsets)."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(60, 6, mode="mean", sparse=True)
        self.out = nn.Linear(6, 3)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.out(self.bag(ids, offsets))


def ratings(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, USERS, n), rng.integers(0, ITEMS // 4, n)], 1)
    return ids.astype(np.int64), rng.normal(size=n).astype(np.float32)


def tables_and_rest(model: TwoTower) -> list[torch.optim.Optimizer]:
    return [torch.optim.SparseAdam([model.user.weight, model.item.weight], lr=0.05),
            torch.optim.Adam(model.head.parameters(), lr=0.01)]


def train(rdd, model, optimizer, iterations=ITERATIONS, **kwargs):
    return DistriOptimizer(model, rdd, nn.MSELoss(), optimizer, batch_size=BATCH,
                           end_trigger=MaxIteration(iterations), seed=SEED, progress_bar=False,
                           **kwargs)


def against_single_process(data, make_model, make_optimizer, seed, moved=1e-3, **kwargs):
    """Train ``make_model()`` with sparkdl and with plain torch on the same union batches;
    assert they agree to 1e-5 and that the weights moved; return both models' initial copy
    and the trained one."""
    x, y, rdd = data
    torch.manual_seed(seed)
    net = make_model()
    initial = copy.deepcopy(net)
    train(rdd, net, make_optimizer(net), **kwargs).optimize()
    reference = reference_train(initial, x, y, nn.MSELoss(), make_optimizer,
                                BatchPlan(SIZES, BATCH, SEED, True), ITERATIONS)
    assert max_abs_diff(net, reference) <= 1e-5
    assert max_abs_diff(net, initial) > moved                 # it trained
    return initial, net


@pytest.fixture(scope="module")
def data(sc):
    x, y = ratings(sum(SIZES))
    return x, y, make_rdd(sc, list(zip(x, y)), SIZES)


@pytest.mark.parametrize("allreduce", ["driver", "shuffle"])
def test_sparse_tables_with_adagrad_equal_single_process(data, allreduce):
    initial, net = against_single_process(
        data, TwoTower, lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1), 1, 1e-2,
        allreduce=allreduce, num_blocks=3)
    x = data[0]
    # Adagrad leaves rows no batch touched (zero gradient, zero state) exactly as they were
    untouched = np.setdiff1d(np.arange(ITEMS), x[:, 1])
    assert len(untouched) > ITEMS // 2
    assert torch.equal(net.item.weight[untouched], initial.item.weight[untouched])


def test_shuffle_and_driver_paths_give_bitwise_the_same_weights(data):
    """The shuffle's blocks sum each id range in partition order, as the driver does."""
    _, _, rdd = data
    trained = []
    for allreduce in ("driver", "shuffle"):
        torch.manual_seed(1)
        net = TwoTower()
        trained.append(train(rdd, net, tables_and_rest(net), iterations=5,
                             allreduce=allreduce, num_blocks=3).optimize())
    assert bitwise_equal(*trained)


def test_sparse_adam_and_adam_as_two_optimizers_equal_single_process(data):
    initial, net = against_single_process(
        data, TwoTower, lambda m: OptimizerSequence(tables_and_rest(m)), 2)
    untouched = np.setdiff1d(np.arange(ITEMS), data[0][:, 1])  # SparseAdam leaves them
    assert torch.equal(net.item.weight[untouched], initial.item.weight[untouched])
    assert not torch.equal(net.item.weight, initial.item.weight)


def test_embedding_bag_with_offsets_equals_single_process(sc):
    rng = np.random.default_rng(5)
    n = sum(SIZES)
    rows = [rng.integers(0, 60, int(rng.integers(1, 9))) for _ in range(n)]
    labels = rng.integers(0, 3, n)

    def collate(inputs):            # a ragged input as EmbeddingBag takes it
        (ids,) = inputs
        lengths = ids.lengths()
        flat = ids.pad(-1)[0]
        flat = flat[flat >= 0] if len(flat) else flat
        return flat, np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)

    records = [((r.astype(np.int64),), int(c)) for r, c in zip(rows, labels)]
    torch.manual_seed(3)
    net = BagNet()
    initial = copy.deepcopy(net)
    DistriOptimizer(net, make_rdd(sc, records, SIZES), nn.CrossEntropyLoss(),
                    [torch.optim.SparseAdam([net.bag.weight], lr=0.05),
                     torch.optim.SGD(net.out.parameters(), lr=0.2)],
                    batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                    sequence_inputs=[0], collate=collate, progress_bar=False).optimize()
    reference = copy.deepcopy(initial)
    optimizer = OptimizerSequence([torch.optim.SparseAdam([reference.bag.weight], lr=0.05),
                                   torch.optim.SGD(reference.out.parameters(), lr=0.2)])
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    for t in range(ITERATIONS):
        idx = plan.global_indices(*plan.epoch_and_step(t))
        ids, offsets = collate([Ragged.from_rows([rows[i] for i in idx], np.int64)])
        optimizer.zero_grad()
        nn.functional.cross_entropy(reference(torch.from_numpy(ids), torch.from_numpy(offsets)),
                                    torch.from_numpy(labels[idx])).backward()
        optimizer.step()
    assert max_abs_diff(net, reference) <= 1e-5
    assert max_abs_diff(net, initial) > 1e-2


def test_resume_with_two_optimizers_equals_the_uninterrupted_run(data, tmp_path):
    _, _, rdd = data

    def run(iterations, path):
        torch.manual_seed(4)
        net = TwoTower()
        optimizer = tables_and_rest(net)
        schedulers = [torch.optim.lr_scheduler.StepLR(optimizer[0], 1, 0.8),
                      torch.optim.lr_scheduler.ExponentialLR(optimizer[1], 0.9)]
        opt = train(rdd, net, optimizer, iterations=iterations, lr_scheduler=schedulers,
                    lr_scheduler_step="iteration", allreduce="shuffle")
        if path is not None:
            opt.set_checkpoint(str(path), SeveralIteration(3))
        return opt.optimize()

    run(7, tmp_path)                     # stops after 7; its newest checkpoint is at 6
    resumed = run(10, tmp_path)
    assert bitwise_equal(resumed, run(10, None))


def test_an_optimizer_that_cannot_take_sparse_gradients_is_refused_before_any_job(sc, data):
    _, _, rdd = data
    net = TwoTower()
    with JobCounter(sc) as jobs:
        with pytest.raises(InvalidArgumentError, match=r"'user\.weight' gets sparse gradients.*"
                                                       r"Adam does not support sparse gradients"):
            train(rdd, net, torch.optim.Adam(net.parameters())).optimize()
        with pytest.raises(InvalidArgumentError, match="disjoint parameters"):
            train(rdd, net, [torch.optim.SGD(net.parameters(), lr=0.1),
                             torch.optim.Adam(net.head.parameters())])
        with pytest.raises(InvalidArgumentError, match="clipping cannot be combined"):
            train(rdd, net, torch.optim.SGD(net.parameters(), lr=0.1)
                  ).set_gradient_clipping(1.0).optimize()
    assert jobs.count == 0


@pytest.mark.parametrize("allreduce", ["driver", "shuffle"])
def test_dense_tables_sent_as_rows_equal_single_process(data, allreduce):
    """Tables with sparse=False travel as their non-zero rows; dense Adam moves every row."""
    against_single_process(data, lambda: TwoTower(sparse=False),
                           lambda m: torch.optim.Adam(m.parameters(), lr=0.01), 7,
                           allreduce=allreduce, num_blocks=3)


class Factorisation(nn.Module):
    """Tables only: the flat gradient vector is empty."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.user = nn.Embedding(USERS, 4, sparse=sparse)
        self.item = nn.Embedding(ITEMS, 4, sparse=sparse)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.user(ids[:, 0]) * self.item(ids[:, 1])).sum(-1)


@pytest.mark.parametrize("sparse", [True, False])
def test_a_model_of_tables_only_trains_through_the_shuffle(data, sparse):
    against_single_process(data, lambda: Factorisation(sparse),
                           lambda m: torch.optim.SGD(m.parameters(), lr=0.5), 8,
                           allreduce="shuffle", num_blocks=3)


def test_a_dense_table_gradient_travels_as_rows_only_when_smaller():
    table = nn.Embedding(100, 4)
    table(torch.tensor([3, 7, 7, 42])).sum().backward()
    ids, values = dense_rows(table.weight.grad, np.float32)
    assert ids.tolist() == [3, 7, 42] and values.shape == (3, 4)
    assert values[1].tolist() == [2.0] * 4
    table.weight.grad = None
    table(torch.arange(100)).sum().backward()          # every row touched: the whole table
    first, values = dense_rows(table.weight.grad, np.float32)
    assert first == 0 and values.shape == (100, 4)
    grads = torch.zeros(100, 4)
    grads[5, 1] = -0.0          # a signed zero is sent, so the rebuilt gradient keeps its bits
    grads[9, 2] = 1.0
    assert dense_rows(grads, np.float32)[0].tolist() == [5, 9]


def test_sparse_rows_sum_in_order_and_split_by_id_range():
    a = (np.array([1, 4, 9]), np.array([[1.0], [2.0], [3.0]], np.float32))
    b = (np.array([0, 4]), np.array([[10.0], [20.0]], np.float32))
    ids, values = sum_rows([a, b], np.float32)
    assert ids.tolist() == [0, 1, 4, 9] and values[:, 0].tolist() == [10.0, 1.0, 22.0, 3.0]
    parts = split_rows((ids, values), np.array([0, 3, 6, 10]))
    assert [p[0].tolist() for p in parts] == [[0, 1], [4], [9]]
    # a table's rows do not take space in the flat gradient vector
    layout = ParamLayout(TwoTower())
    dense = sum(p.numel() for p in TwoTower().head.parameters())
    assert layout.size == dense and len(layout.sparse) == 2
    assert ParamLayout(TwoTower(sparse=False)).size == dense
    assert len(ParamLayout(TwoTower(sparse=False)).tables) == 2


def test_in_process_runner_gives_bitwise_the_spark_result(data):
    x, y, rdd = data
    parts = [list(zip(x[a:b], y[a:b])) for a, b in
             zip(np.cumsum([0] + SIZES[:-1]), np.cumsum(SIZES))]
    trained = []
    for source in (rdd, LocalPartitions(parts)):
        torch.manual_seed(6)
        net = TwoTower()
        trained.append(train(source, net, torch.optim.SGD(net.parameters(), lr=0.3),
                             iterations=4, allreduce="driver").optimize())
    assert bitwise_equal(*trained)


class UserItem(nn.Module):
    """The two-tower model taking the user and item id columns as two arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = TwoTower()

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return self.towers(torch.stack([user, item], 1))


def test_estimator_trains_sparse_tables_from_id_columns_with_two_optimizers(spark):
    from sparkdl import NNEstimator

    x, y = ratings(200, seed=3)
    df = spark.createDataFrame([(int(u), int(i), float(r)) for (u, i), r in zip(x, y)],
                               ["user", "item", "rating"])

    def optimizers(params, lr, model):
        towers = model.towers
        return [torch.optim.SparseAdam([towers.user.weight, towers.item.weight], lr=lr),
                torch.optim.Adam(towers.head.parameters(), lr=lr / 5)]

    torch.manual_seed(9)
    net = UserItem()
    est = NNEstimator(model=net, criterion=nn.MSELoss(), optimizerFactory=optimizers,
                      learningRate=0.05, inputCols=["user", "item"], labelCol="rating",
                      maxEpoch=2, batchSize=32, numTrainWorkers=1, seed=3, progressBar=False)
    fitted = est.fit(df)
    plan = BatchPlan([len(y)], 32, 3, True)
    expected = reference_train(net, (x[:, 0].copy(), x[:, 1].copy()), y, nn.MSELoss(),
                               lambda m: OptimizerSequence(optimizers(None, 0.05, m)), plan,
                               2 * plan.iterations_per_epoch)
    assert max_abs_diff(fitted.module, expected) <= 1e-5
    assert max_abs_diff(fitted.module, net) > 1e-3


@pytest.mark.parametrize("sparse", [True, False])
def test_a_masked_loss_divides_the_tables_rows_like_the_vector(sparse):
    """Ignored targets: the driver divides by the union's count of targets, rows included."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ids, self.out = nn.Embedding(50, 4, sparse=sparse), nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.ids(x))

    rng = np.random.default_rng(4)
    n = sum(SIZES)
    x, y = rng.integers(0, 50, n).astype(np.int64), rng.integers(-1, 3, n).astype(np.int64)
    parts = [list(zip(x[a:b], y[a:b])) for a, b in
             zip(np.cumsum([0] + SIZES[:-1]), np.cumsum(SIZES))]
    criterion = nn.CrossEntropyLoss(ignore_index=-1)
    torch.manual_seed(0)
    net = Net()
    initial = copy.deepcopy(net)
    DistriOptimizer(net, LocalPartitions(parts), criterion,
                    torch.optim.SGD(net.parameters(), lr=0.5), batch_size=BATCH,
                    end_trigger=MaxIteration(ITERATIONS), seed=SEED, progress_bar=False).optimize()
    reference = reference_train(initial, x, y, criterion,
                                lambda m: torch.optim.SGD(m.parameters(), lr=0.5),
                                BatchPlan(SIZES, BATCH, SEED, True), ITERATIONS)
    assert max_abs_diff(net, reference) <= 1e-5
    assert max_abs_diff(net, initial) > 1e-2


def test_rows_sum_bitwise_like_the_dense_tables_in_partition_order():
    """Explicit and whole-table rows of three tasks sum to bitwise the dense sum
    (g0 + g1) + g2 that the flat vector forms."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        grads = []
        for _ in range(3):
            g = np.zeros((16, 8), np.float32)
            rows = rng.choice(16, int(rng.integers(1, 17)), replace=False)
            g[rows] = rng.normal(size=(len(rows), 8)) * 10.0 ** float(rng.integers(-8, 2))
            grads.append(g)
        parts = [dense_rows(torch.from_numpy(g), np.float32) for g in grads]
        total = dense_grad(sum_rows(parts, np.float32), torch.zeros(16, 8)).numpy()
        assert np.array_equal(total, (grads[0] + grads[1]) + grads[2])


@pytest.fixture
def verified_replicas(sc):
    """Every task hashes its whole replica and compares it with the driver's weights."""
    sc.setLocalProperty("spark.sparkdl.verifyReplicas", "true")
    yield
    sc.setLocalProperty("spark.sparkdl.verifyReplicas", None)


def test_row_deltas_keep_every_replica_bitwise_the_drivers_for_50_iterations(
        data, verified_replicas, caplog):
    """SparseAdam (tables) and Adam (head): the refresh sends the touched rows and the head;
    a full copy when the deltas since the last would outgrow it. A validation job every 7
    iterations loads other weights into the same replicas. Every task of 50 iterations checks
    its replica's hash against the driver's; the result equals single-process torch."""
    from sparkdl import Loss

    x, y, rdd = data
    torch.manual_seed(4)
    net = TwoTower()
    initial = copy.deepcopy(net)
    engine = train(rdd, net, tables_and_rest(net), iterations=50)
    engine.set_validation(rdd, SeveralIteration(7), [Loss()], batch_size=32)
    with caplog.at_level("INFO", logger="sparkdl"):
        engine.optimize()
    assert len(engine.summary.validations) == 7
    line = next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("the weights travelled as"))
    fulls, deltas = (int(w) for w in re.findall(r"(\d+) (?:full copies|row deltas)", line))
    assert deltas >= 30 and 2 <= fulls <= 20, line
    reference = reference_train(initial, x, y, nn.MSELoss(),
                                lambda m: OptimizerSequence(tables_and_rest(m)),
                                BatchPlan(SIZES, BATCH, SEED, True), 50)
    assert max_abs_diff(net, reference) <= 1e-5


def _refresh_setup(optimizer_of):
    """A driver's model, optimizer, weights and publisher (values held in this process) and a
    function that makes a worker's replica of it."""
    import pickle

    from sparkdl.executor.replicas import Replica, ReplicaSpec
    from sparkdl.transport.weight_refresh import (DriverWeights, HeldValue, RefreshPublisher,
                                                  row_local_tables)

    torch.manual_seed(6)
    net = TwoTower()
    optimizer = optimizer_of(net)
    layout = ParamLayout(net)
    weights = DriverWeights(layout, net, row_local_tables(layout, net,
                                                          optimizer_members(optimizer)))
    publisher = RefreshPublisher(HeldValue, layout.fingerprint, verify=True)
    spec = pickle.dumps(ReplicaSpec(copy.deepcopy(net), nn.MSELoss(), "mean"))
    return net, optimizer, weights, publisher, lambda: Replica(pickle.loads(spec))


def _driver_step(net, optimizer, weights, rng):
    """One optimizer step on a random batch, as the driver takes it; the next StateVersion."""
    from sparkdl.transport.table_rows import Rows

    ids = torch.from_numpy(np.stack([rng.integers(0, USERS, 16), rng.integers(0, ITEMS, 16)], 1))
    nn.MSELoss()(net(ids), torch.ones(16)).backward()
    rows: dict[int, Rows] = {}
    for k, (_, p) in enumerate(net.named_parameters()):
        if p.grad is not None and p.grad.is_sparse:
            g = p.grad.coalesce()
            rows[k] = (g.indices()[0].numpy(), g.values().numpy())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return weights.advance(net, rows)


def test_replicas_catch_up_through_deltas_or_read_the_full_copy():
    """A replica one version behind applies one delta; one several behind applies them in
    order; a new one reads the full copy: all hold bitwise the driver's weights (verified
    by hash in sync_replica, and here tensor by tensor)."""
    from sparkdl.transport.weight_refresh import row_local_tables, sync_replica

    net, optimizer, weights, publisher, new_replica = _refresh_setup(
        lambda m: OptimizerSequence(tables_and_rest(m)))
    assert row_local_tables(weights.layout, net, optimizer.optimizers) == [0, 1]  # head: Adam
    rng = np.random.default_rng(0)
    every, sometimes = new_replica(), new_replica()
    reads = {"every": 0, "sometimes": 0, "late": 0}
    kinds = []
    for version in range(1, 31):
        refresh = publisher.publish(weights.current())
        kinds.append(len(refresh.deltas))
        reads["every"] += sync_replica(every, refresh)[1]
        if version % 4 == 0:
            reads["sometimes"] += sync_replica(sometimes, refresh)[1]
        _driver_step(net, optimizer, weights, rng)
    refresh = publisher.publish(weights.current())
    late = new_replica()
    for name, replica in (("every", every), ("sometimes", sometimes), ("late", late)):
        reads[name] += sync_replica(replica, refresh)[1]
        assert bitwise_equal(replica.model, net), name
    assert reads["late"] == 1 and reads["every"] == 1 and max(kinds) >= 3
    assert publisher.delta_count >= 20 and publisher.full_copies >= 2


def test_a_replica_that_missed_a_change_is_caught():
    """A delta that does not chain onto the replica's version, and a replica whose weights
    differ from the driver's, are errors the task raises, never silent."""
    from sparkdl.errors import ReplicaMismatchError, SparkdlError
    from sparkdl.transport.weight_refresh import sync_replica

    net, optimizer, weights, publisher, new_replica = _refresh_setup(
        lambda m: OptimizerSequence(tables_and_rest(m)))
    rng = np.random.default_rng(1)
    replica = new_replica()
    sync_replica(replica, publisher.publish(weights.current()))
    _driver_step(net, optimizer, weights, rng)
    refresh = publisher.publish(weights.current())
    version, chain, handle = refresh.deltas[-1]
    ids, rows = handle.value.rows[1]
    rows[0, 0] ^= 1                                  # one bit of one row, in transit
    with pytest.raises(SparkdlError, match="does not chain onto"):
        sync_replica(replica, refresh)
    rows[0, 0] ^= 1
    sync_replica(replica, refresh)                   # reads the full copy again, then the delta
    with torch.no_grad():                            # a row the driver's weights do not have
        replica.model.item.weight[int(ids[0])] += 1.0
    replica.refresh_state.chain = chain
    with pytest.raises(ReplicaMismatchError, match="differ from the driver's"):
        sync_replica(replica, refresh)


def test_only_optimizers_that_leave_untouched_rows_alone_get_row_deltas():
    from sparkdl.transport.weight_refresh import row_local_tables

    def local(make):
        torch.manual_seed(0)
        net = TwoTower()
        return row_local_tables(ParamLayout(net), net, optimizer_members(make(net)))

    assert local(lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1)) == [0, 1]
    assert local(lambda m: torch.optim.SGD(m.parameters(), lr=0.1)) == [0, 1]
    assert local(lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)) == []
    renormed = TwoTower()
    renormed.item.max_norm = 1.0     # forward passes rewrite its rows in the replicas
    assert row_local_tables(ParamLayout(renormed), renormed,
                            [torch.optim.Adagrad(renormed.parameters(), lr=0.1)]) == [0]
    hooked = torch.optim.SparseAdam([renormed.user.weight, renormed.item.weight])
    assert row_local_tables(ParamLayout(renormed), renormed, [hooked]) == [0]
    hooked.register_step_post_hook(lambda *_: None)     # user code after the step: any row
    assert row_local_tables(ParamLayout(renormed), renormed, [hooked]) == []
    assert local(lambda m: OptimizerSequence([
        torch.optim.SparseAdam([m.user.weight], lr=0.1),
        torch.optim.SGD([m.item.weight], lr=0.1, momentum=0.5),
        torch.optim.Adam(m.head.parameters())])) == [0]


class MomentumAfter(torch.optim.lr_scheduler.LambdaLR):
    """A constant learning rate whose ``after``-th step gives every group momentum 0.9 (the
    user's schedule of an optimizer setting that decides whether a table is row-local)."""

    def __init__(self, optimizer, after: int) -> None:
        self.after, self.steps = after, 0
        super().__init__(optimizer, lambda _: 1.0)

    def step(self, *args, **kwargs):
        super().step(*args, **kwargs)
        self.steps += 1
        if self.steps == self.after + 1:       # the constructor steps once
            for group in self.optimizer.param_groups:
                group["momentum"] = 0.9


def test_a_table_that_stops_being_row_local_mid_run_is_sent_whole(data, verified_replicas,
                                                                   caplog):
    """SGD without momentum sends row deltas; when the schedule turns momentum on after
    iteration 5 every row may move: the weights are taken anew and sent whole from then on,
    the replicas verified each iteration; the result equals single-process torch."""
    x, y, rdd = data
    torch.manual_seed(8)
    net = TwoTower()
    initial = copy.deepcopy(net)
    sgd = torch.optim.SGD(net.parameters(), lr=0.05)
    with caplog.at_level("INFO", logger="sparkdl"):
        train(rdd, net, sgd, lr_scheduler=MomentumAfter(sgd, 5),
              lr_scheduler_step="iteration").optimize()
    assert any("the tables sent as row deltas are now none" in r.getMessage()
               for r in caplog.records)
    reference = reference_train(initial, x, y, nn.MSELoss(),
                                lambda m: torch.optim.SGD(m.parameters(), lr=0.05),
                                BatchPlan(SIZES, BATCH, SEED, True), ITERATIONS,
                                lambda o: MomentumAfter(o, 5), "iteration")
    assert max_abs_diff(net, reference) <= 1e-5


def _pass_fit(rdd, setting: dict, allreduce: str) -> DistriOptimizer:
    """One fit of the tables grid below (torch seeded: the same initial weights every call)."""
    torch.manual_seed(setting["init"])
    net = TwoTower(sparse=setting["sparse"])
    optimizer = {"sparse_adam": lambda: OptimizerSequence(tables_and_rest(net)),
                 "adagrad": lambda: torch.optim.Adagrad(net.parameters(), lr=0.1),
                 "sgd": lambda: torch.optim.SGD(net.parameters(), lr=0.05)}[setting["opt"]]()
    return DistriOptimizer(net, rdd, nn.MSELoss(), optimizer, batch_size=setting["batch"],
                           end_trigger=MaxIteration(setting["iterations"]), seed=SEED,
                           progress_bar=False, allreduce=allreduce, num_blocks=3,
                           compression=setting.get("compression"))


TABLES_GRID = [
    {"init": 2, "sparse": True, "opt": "sparse_adam", "batch": BATCH, "iterations": 7},
    {"init": 3, "sparse": True, "opt": "adagrad", "batch": 32, "iterations": 5,
     "compression": "bf16"},
    {"init": 4, "sparse": False, "opt": "sgd", "batch": 40, "iterations": 6}]


def test_fits_with_tables_train_in_one_pass_each_bitwise_alone(data, verified_replicas, caplog):
    """Three recommenders with other optimizers, batch sizes, lengths, sparse and dense tables
    and one with bf16 gradients, trained in one pass on each AllReduce path: each fit's rows
    are summed on their own (by block on the shuffle), each fit's replicas are refreshed as
    alone (the sparse tables by their own row deltas) and verified against the driver's weights
    every task, and each fit is bitwise the same fit alone; the first equals single-process
    torch."""
    from sparkdl import FitSet

    def travelled() -> list[str]:
        return sorted(r.getMessage() for r in caplog.records
                      if r.getMessage().startswith("the weights travelled as"))

    x, y, rdd = data
    alone = [_pass_fit(rdd, s, "shuffle") for s in TABLES_GRID]
    with caplog.at_level("INFO", logger="sparkdl"):
        for fit in alone:
            fit.optimize()
    alone_travelled = travelled()
    for allreduce in ("shuffle", "driver"):
        together = [_pass_fit(rdd, s, allreduce) for s in TABLES_GRID]
        fit_set = FitSet(together)
        caplog.clear()
        with caplog.at_level("INFO", logger="sparkdl"):
            fit_set.run()
        assert fit_set.passes == [[0, 1, 2]]
        assert fit_set.jobs == max(s["iterations"] for s in TABLES_GRID)
        for k, (one, fit) in enumerate(zip(alone, together)):
            assert fit.iteration == TABLES_GRID[k]["iterations"]
            assert bitwise_equal(fit.model, one.model), (allreduce, k)
        # each fit's refresh as alone: the sparse tables' fits by row deltas, the dense one
        # (not row-local) by full copies
        assert travelled() == alone_travelled
        deltas = sorted(int(re.search(r"(\d+) row deltas", line).group(1))
                        for line in alone_travelled)
        assert deltas[0] == 0 and deltas[1] >= 3, alone_travelled
    torch.manual_seed(2)
    reference = reference_train(TwoTower(), x, y, nn.MSELoss(),
                                lambda m: OptimizerSequence(tables_and_rest(m)),
                                BatchPlan(SIZES, BATCH, SEED, True), 7)
    assert max_abs_diff(together[0].model, reference) <= 1e-5
