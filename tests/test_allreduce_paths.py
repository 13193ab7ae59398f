"""The AllReduce paths: the automatic choice, and bf16 gradient compression on the wire."""

from __future__ import annotations

import copy
import logging

import os

import numpy as np
import pytest
import torch

from models import BatchNormNet, SmallNet, bitwise_equal, classification_data, make_rdd
from sparkdl import DistriOptimizer, InvalidArgumentError
from sparkdl.transport.allreduce import DRIVER_ALLREDUCE_MAX_BYTES, choose_allreduce, sum_in_order
from sparkdl.transport.flat_layout import ParamLayout
from sparkdl.triggers import MaxIteration
from sparkdl.transport.codecs import Bf16Codec, ExactCodec


def train(sc, net_class=SmallNet, iterations=6, **kwargs):
    x, y = classification_data(100, seed=3)
    torch.manual_seed(11)
    net = net_class()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [45, 55]),
                          torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9),
                          batch_size=20, end_trigger=MaxIteration(iterations), seed=1,
                          progress_bar=False, **kwargs)
    return opt.optimize(), opt


def test_auto_picks_the_driver_for_small_and_the_shuffle_for_large_gradients():
    assert choose_allreduce(800_000, 2) == "driver"          # W1: 0.8 MB from 2 tasks
    assert choose_allreduce(80_000_000, 2) == "shuffle"      # W3: 76 MiB from 2 tasks
    small = DRIVER_ALLREDUCE_MAX_BYTES // 8
    assert choose_allreduce(small, 8) == "driver" and choose_allreduce(small, 9) == "shuffle"


def test_auto_logs_its_choice_and_equals_both_explicit_paths(sc, caplog):
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        auto, _ = train(sc)
    assert any("DriverAllReduce" in r.getMessage() for r in caplog.records)
    shuffle, _ = train(sc, allreduce="shuffle")
    assert bitwise_equal(auto, shuffle)


def test_bf16_codec_rounds_gradients_and_keeps_buffers_exact():
    rng = np.random.default_rng(0)
    vector = rng.normal(size=1000).astype(np.float32)
    vector[900:] = np.arange(100) + 1234567          # "buffers": integers bf16 cannot hold
    codec = Bf16Codec(np.float32, exact_from=900)
    for lo, hi in [(0, 1000), (0, 450), (450, 1000), (950, 1000)]:
        payload = codec.encode(vector[lo:hi], lo)
        rounded = min(max(900 - lo, 0), hi - lo)
        assert len(payload) == 2 * rounded + 4 * (hi - lo - rounded)
        back = codec.decode(payload, lo, hi - lo)
        expected = torch.from_numpy(vector[lo:hi]).to(torch.bfloat16).float().numpy()
        expected[rounded:] = vector[lo + rounded:hi]
        assert np.array_equal(back, expected)
    assert np.array_equal(ExactCodec(np.float32).decode(
        ExactCodec(np.float32).encode(vector, 0), 0, 1000), vector)


@pytest.mark.parametrize("allreduce", ["shuffle", "driver"])
def test_bf16_training_stays_close_to_exact_training(sc, allreduce):
    exact, _ = train(sc, allreduce=allreduce)
    half, opt = train(sc, allreduce=allreduce, compression="bf16")
    assert not bitwise_equal(exact, half)                # the rounding really happened
    for a, b in zip(exact.parameters(), half.parameters()):
        assert torch.allclose(a, b, rtol=0.02, atol=2e-3)


def test_bf16_keeps_batchnorm_buffers_exact(sc):
    exact, _ = train(sc, BatchNormNet)
    half, _ = train(sc, BatchNormNet, compression="bf16")
    assert int(half.bn.num_batches_tracked) == int(exact.bn.num_batches_tracked) == 6
    assert torch.allclose(half.bn.running_mean, exact.bn.running_mean, atol=5e-3)


def test_unknown_compression_is_refused(sc):
    with pytest.raises(InvalidArgumentError, match="compression"):
        train(sc, compression="fp8")


def test_frames_split_long_buffers_without_copying_and_join_back(monkeypatch):
    from sparkdl.transport import frames as spark_frames

    data = np.arange(1000, dtype=np.float32)
    (single,) = spark_frames.buffer_frames(data)
    assert single.obj is data and len(single) == 4000          # a view, not a copy
    monkeypatch.setattr(spark_frames, "MAX_FRAME_BYTES", 1024)
    frames = spark_frames.buffer_frames(data)
    assert [len(f) for f in frames] == [1024, 1024, 1024, 928]
    joined = spark_frames.join_frames([bytes(f) for f in frames])
    assert np.array_equal(np.frombuffer(joined, dtype=np.float32), data)


def test_frames_shuffle_keeps_each_tasks_order(sc):
    from sparkdl.transport import frames as spark_frames

    def emit(partition, records):
        for frame in (b"head-%d" % partition, bytes(range(partition, partition + 200))):
            for k in range(3):
                yield from spark_frames.keyed_frame(k, frame + b"-%d" % k)

    def collect(k, frames):
        yield spark_frames.header((k, list(frames)))

    source = sc.parallelize(range(4), 4)
    shuffled = spark_frames.shuffle_frames(source.mapPartitionsWithIndex(emit), 3)
    out = spark_frames.raw_output(shuffled.mapPartitionsWithIndex(collect)).collect()
    received = dict(spark_frames.read_header(f) for f in out)
    assert sorted(received) == [0, 1, 2]
    for k, frames in received.items():
        assert all(isinstance(f, bytes) for f in frames) and len(frames) == 8
        pairs = sorted(zip(frames[::2], frames[1::2]))
        assert pairs == [(b"head-%d-%d" % (p, k), bytes(range(p, p + 200)) + b"-%d" % k)
                         for p in range(4)]


def test_replica_objects_are_frozen_out_of_the_per_task_collection_until_dropped():
    import gc

    from sparkdl.executor.replicas import ReplicaSpec, drop_replica, get_replica

    class Spec:
        value = ReplicaSpec(torch.nn.Linear(3, 2), torch.nn.MSELoss(), "mean")

    gc.unfreeze()
    try:
        replica = get_replica("freeze-test", Spec())
        assert gc.get_freeze_count() > 0          # torch, the model: out of gc.collect()'s walk
        assert get_replica("freeze-test", Spec()) is replica
        drop_replica("freeze-test")
        assert gc.get_freeze_count() == 0         # given back, so its cycles can be reclaimed
    finally:
        gc.unfreeze()


class _Report:
    def __init__(self, partition, missing):
        self.partition, self.missing_shard = partition, missing
        self.started_at = self.finished_at = 0.0


def _vectors(n, size=1001):
    rng = np.random.default_rng(4)
    return [rng.normal(size=size).astype(np.float32) * 10 ** (i % 3) for i in range(n)]


def _expected_sum(vectors):
    expected = vectors[0].copy()
    for v in vectors[1:]:
        expected += v
    return expected


def test_after_a_miss_only_the_missing_vector_and_the_driver_sum_are_computed_again(sc):
    """A task that found no shard on the driver path: complete() adds the filled vector without
    running any other task again, and the sum is bitwise the undisturbed one (partition
    order)."""
    from sparkdl.transport.allreduce import DriverAllReduce

    n, missing = 5, 2
    vectors = _vectors(n)
    computed = sc.accumulator(0)

    def local_fn(partition, _):
        computed.add(1)
        if partition == missing:
            return None, _Report(partition, True)
        return vectors[partition], _Report(partition, False)

    allreduce = DriverAllReduce(vectors[0].size, np.float32)
    index = sc.parallelize(range(n), n)
    first = allreduce.run(index, local_fn)
    assert first.missing_partitions == [missing] and computed.value == n
    result = allreduce.complete(first, {missing: (vectors[missing], _Report(missing, False))})
    assert computed.value == n                  # no map task ran again
    assert result.missing_partitions == [] and [r.partition for r in result.reports] == \
        list(range(n))
    assert np.array_equal(result.vector, _expected_sum(vectors))
    undisturbed = allreduce.run(index, lambda p, _: (vectors[p], _Report(p, False)))
    assert np.array_equal(undisturbed.vector, result.vector)


@pytest.mark.parametrize("missing", [[2], [0, 4]])
def test_after_a_miss_the_filled_vector_goes_through_the_shuffle_blocks(sc, missing):
    """A task that found no shard on the shuffle path: each fill is a map task of a shuffle of
    its own, emitting its vector as the run's tasks do, and complete() reruns only the reduce
    stage over the run's shuffle and every fill's (no other map task runs again; one fill job
    per missing partition here, so the second completion reads three shuffles). The sum is
    bitwise the undisturbed one, each filled partition's report replaces its miss, and the
    fill's shard summaries come back beside the reports."""
    from sparkdl.transport.allreduce import ShuffleAllReduce
    from sparkdl.transport.python_jobs import PythonJobs

    n = 5
    vectors = _vectors(n)
    computed = sc.accumulator(0)

    def local_fn(partition, _):
        computed.add(1)
        if partition in missing:
            return None, _Report(partition, True)
        return vectors[partition], _Report(partition, False)

    allreduce = ShuffleAllReduce(vectors[0].size, np.float32, 3)
    index = sc.parallelize(range(n), n)
    result = allreduce.run(index, local_fn)
    assert result.missing_partitions == missing and computed.value == n
    jobs, side = PythonJobs.of(sc), allreduce.fill_side()

    def fill(_, records):
        p = next(iter(records))
        return side.emit(p, vectors[p], _Report(p, False), f"shard {p}")

    for k, p in enumerate(missing):
        fills = jobs.map_partitions(jobs.rdd(sc.parallelize([p], 1)), fill)
        result, summaries = allreduce.complete(result, fills)
        assert summaries == {q: f"shard {q}" for q in missing[:k + 1]}
        assert result.missing_partitions == missing[k + 1:]
    assert computed.value == n                  # no map task of the run ran again
    assert [r.partition for r in result.reports] == list(range(n))
    assert np.array_equal(result.vector, _expected_sum(vectors))
    undisturbed = allreduce.run(index, lambda p, _: (vectors[p], _Report(p, False)))
    assert np.array_equal(undisturbed.vector, result.vector)
    allreduce.settle()


@pytest.mark.parametrize("codec_name", [None, "bf16"])
@pytest.mark.parametrize("missing", [[0], [2], [1, 3], [4]])
def test_connect_shuffle_blocks_after_a_miss_finish_on_the_client_bitwise(codec_name, missing):
    """The Spark Connect shuffle's reduce side and the client, without Spark: a reducer's sum
    stops before the first missing partition and sends the later blocks; the client goes on
    adding, the filled vectors in their place, to bitwise the undisturbed reducers' sums (no
    other task's vector computed again)."""
    import pyarrow as pa

    from sparkdl.executor.arrow_tasks import ArrowGradientMap, ArrowReduce, read_rows
    from sparkdl.runners import connect_summing
    from sparkdl.runners.connect_summing import Summing as _Summing
    from sparkdl.transport.allreduce import DriverAllReduce, block_bounds
    from sparkdl.transport.codecs import make_codec

    n, size = 5, 1001
    vectors = _vectors(n, size)
    codec = make_codec(codec_name, np.dtype(np.float32), size - 7)
    bounds = block_bounds(size, 3)

    def reduced(absent):
        def task(partition, _):
            if partition in absent:
                return None, _Report(partition, True)
            return vectors[partition], _Report(partition, False)

        rows = [r for p in range(n) for r in read_rows(ArrowGradientMap(task, bounds, codec)(
            [pa.RecordBatch.from_pydict({"partition": [p]})]))]
        by_block = {}
        for r in rows:
            by_block.setdefault(r["k"], []).append(r)
        out = []
        for k, block_rows in by_block.items():
            batch = pa.RecordBatch.from_pylist(block_rows)
            out.extend(ArrowReduce(bounds, codec)([batch]))
        return pa.Table.from_batches(out)

    summing = _Summing(size, np.dtype(np.float32), False, bounds, codec,
                       DriverAllReduce(size, np.float32, codec))
    undisturbed = connect_summing.shuffle_result(reduced([]), 0.0, summing)
    first = connect_summing.shuffle_result(reduced(missing), 0.0, summing)
    assert first.missing_partitions == missing and first.pending_blocks is not None
    filled = {p: (vectors[p], _Report(p, False)) for p in missing}
    done = connect_summing.complete(first, filled, summing)
    assert done.missing_partitions == [] and len(done.reports) == n
    assert np.array_equal(done.vector, undisturbed.vector)


def test_collected_messages_are_read_straight_into_their_destinations(sc):
    from sparkdl.transport import frames as spark_frames

    n = 70_000                      # several socket reads per payload, split into 3 frames

    def emit(partition, records):
        list(records)
        data = np.arange(n, dtype=np.float32) * (partition + 1)
        frames = list(spark_frames.buffer_frames(data))
        step = -(-len(frames[0]) // 3)
        split = [frames[0][lo:lo + step] for lo in range(0, len(frames[0]), step)]
        yield spark_frames.header(((partition, "into"), len(split)))
        yield from split
        yield from spark_frames.message_frames((partition, "bytes"), data[:5])
        yield from spark_frames.message_frames((partition, "none"), None)

    rdd = spark_frames.raw_output(sc.parallelize(range(3), 3).mapPartitionsWithIndex(emit))
    out = np.full(3 * n, -1.0, dtype=np.float32)
    messages = spark_frames.collect_messages(
        rdd, lambda head: out[head[0] * n:(head[0] + 1) * n] if head[1] == "into" else None)
    assert [head for head, _ in messages] == [(p, kind) for p in range(3)
                                               for kind in ("into", "bytes", "none")]
    expected = np.concatenate([np.arange(n, dtype=np.float32) * (p + 1) for p in range(3)])
    assert out.tobytes() == expected.tobytes()
    for (p, kind), payload in messages:
        if kind == "into":
            assert np.shares_memory(payload, out)
        elif kind == "bytes":
            assert payload == (np.arange(5, dtype=np.float32) * (p + 1)).tobytes()
        else:
            assert payload is None

    with pytest.raises(ValueError, match="longer than its destination"):
        spark_frames.collect_messages(rdd, lambda head: np.zeros(10, np.float32)
                                      if head[1] == "into" else None)
    again = spark_frames.collect_messages(rdd, lambda head: None)    # the session still works
    assert [head for head, _ in again] == [head for head, _ in messages]
    assert again[0][1] == expected[:n].tobytes()


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_sum_in_order_is_the_left_to_right_float_sum_and_a_new_vector(parts):
    rng = np.random.default_rng(parts)
    vectors = [rng.normal(size=1001).astype(np.float32) for _ in range(parts)]
    codec = ExactCodec(np.dtype(np.float32))
    payloads = [(p, codec.encode(v, 0)) for p, v in enumerate(vectors)]
    expected = vectors[0].copy()
    for v in vectors[1:]:
        expected = expected + v                          # partition order, as torch would
    total = sum_in_order(reversed(payloads + [(parts, None)]), codec, 0, 1001)
    assert total.tobytes() == expected.tobytes()
    assert not any(np.shares_memory(total, v) for v in vectors)
    total += 1                                           # the sum is the caller's to change
    assert sum_in_order(payloads, codec, 0, 1001).tobytes() == expected.tobytes()


def test_summed_gradients_become_views_of_the_vector_and_a_step_matches_torch():
    torch.manual_seed(0)
    net, ref = SmallNet(), SmallNet()
    ref.load_state_dict(net.state_dict())
    layout = ParamLayout(net)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    vector = np.concatenate([p.grad.reshape(-1).numpy() for p in ref.parameters()])
    present = np.ones(len(layout.params), dtype=np.int64)
    layout.set_grads(net, vector, present)
    for p, q in zip(net.parameters(), ref.parameters()):
        assert np.shares_memory(p.grad.numpy(), vector)          # no copy on the driver
        assert torch.equal(p.grad, q.grad)
    absent = present.copy()
    absent[0] = 0                                    # no task gave the first one a gradient
    half = copy.deepcopy(net).to(torch.bfloat16)
    half_layout = ParamLayout(half)
    half_layout.set_grads(half, vector, absent)
    grads = [p.grad for p in half.parameters()]
    assert grads[0] is None
    assert all(g.dtype == torch.bfloat16 for g in grads[1:])
    assert all(torch.equal(g, q.grad.to(torch.bfloat16))
               for g, q in zip(grads[1:], list(ref.parameters())[1:]))
    for model in (net, ref):
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), ref.parameters()))
    frozen = vector.copy()                                     # a read-only vector is copied
    frozen.flags.writeable = False
    layout.set_grads(net, frozen, present)
    assert not np.shares_memory(next(net.parameters()).grad.numpy(), frozen)


def test_a_pass_under_connect_sends_each_fits_table_rows_once_and_splits_them_by_fit():
    """Spark Connect's shuffle with a pass's reports, without Spark: block 0 carries each
    partition's embedding rows (keyed by fit and parameter), the other blocks' reducers get the
    report without them (they read only the absent ranges); the client's result splits into
    each fit's own rows, summed in partition order as the fit's own job would."""
    import pickle

    import pyarrow as pa

    from sparkdl.executor.arrow_tasks import ArrowGradientMap, ArrowReduce, read_rows
    from sparkdl.executor.step import TaskReport
    from sparkdl.executor.tasks import PassReport
    from sparkdl.runners import connect_summing
    from sparkdl.runners.connect_summing import Summing as _Summing
    from sparkdl.transport.allreduce import DriverAllReduce, block_bounds
    from sparkdl.transport.codecs import ExactCodec
    from sparkdl.transport.pass_results import split_pass_result
    from sparkdl.transport.table_rows import gather_rows

    f32 = np.dtype(np.float32)
    sizes, n = [6, 4], 3
    size, bounds, codec = sum(sizes), block_bounds(sum(sizes), 3), ExactCodec(f32)
    vectors = _vectors(n, size)

    def rows(p):
        return {(0, 1): (np.array([p, 5]), np.full((2, 2), p + 0.25, np.float32)),
                (1, 0): (np.array([2]), np.full((1, 2), -p - 0.5, np.float32))}

    def task(partition, _):
        absent = ((6, 10),) if partition == 1 else ()     # fit 1 took no rows here
        table_rows = rows(partition)
        if absent:
            del table_rows[(1, 0)]
        return vectors[partition], PassReport(partition, [TaskReport(partition=partition)] * 2,
                                              absent=absent, table_rows=table_rows)

    mapped = [r for p in range(n) for r in read_rows(ArrowGradientMap(task, bounds, codec)(
        [pa.RecordBatch.from_pydict({"partition": [p]})]))]
    heads = [(r["k"], pickle.loads(r["report"])) for r in mapped if r["report"] is not None]
    assert sorted(h.partition for k, h in heads if h.table_rows) == [0, 1, 2]
    assert all(k == 0 for k, h in heads if h.table_rows)
    assert [(k, h.absent) for k, h in heads if k > 0] == [(1, ((6, 10),)), (2, ((6, 10),))]
    by_block: dict = {}
    for r in mapped:
        by_block.setdefault(r["k"], []).append(r)
    reduced = pa.Table.from_batches([b for k in sorted(by_block) for b in ArrowReduce(
        bounds, codec)([pa.RecordBatch.from_pylist(by_block[k])])])
    summing = _Summing(size, f32, False, bounds, codec, DriverAllReduce(size, f32, codec))
    result = connect_summing.shuffle_result(reduced, 0.0, summing)
    first, second = split_pass_result(result, sizes)
    assert first.rows is None and second.rows is None     # the driver sums them, per fit
    mine = gather_rows(first.reports, f32)
    assert list(mine) == [1]
    assert np.array_equal(mine[1][0], [0, 1, 2, 5])
    expected = np.float32(0.25) + np.float32(1.25) + np.float32(2.25)   # row 5: 0, 1, 2
    assert mine[1][1][3].tolist() == [expected] * 2
    theirs = gather_rows(second.reports, f32)
    assert np.array_equal(theirs[0][0], [2])
    assert theirs[0][1].tolist() == [[np.float32(-0.5) + np.float32(-2.5)] * 2]
    expected_vector = vectors[0] + vectors[1] + vectors[2]
    assert np.array_equal(first.vector, expected_vector[:6])
    assert np.array_equal(second.vector, vectors[0][6:] + vectors[2][6:])


def test_a_vector_above_a_jobs_share_is_collected_in_several_jobs_with_the_same_bits(
        sc, monkeypatch):
    """Issue 54: blocks no larger than a job may hand the driver, each job collecting as many
    as fit (the later jobs run only reduce tasks over the map outputs), and bitwise the sum of
    one job; a miss is completed the same way. On a local master the vectors and the reducers'
    sums travel as files instead (one job, nothing through the JVM, the files removed): the same
    bits."""
    from models import JobCounter
    from sparkdl.transport.allreduce import ShuffleAllReduce, job_intake, shuffle_blocks
    from sparkdl.transport.python_jobs import PythonJobs

    n, size = 4, 10_001
    vectors = _vectors(n, size)
    computed = sc.accumulator(0)

    def local_fn(partition, _):
        computed.add(1)
        return vectors[partition], _Report(partition, False)

    index = sc.parallelize(range(n), n).cache()
    whole_reduce = ShuffleAllReduce(size, np.float32, 3)
    whole = whole_reduce.run(index, local_fn)
    assert np.array_equal(whole.vector, vectors[0] + vectors[1] + vectors[2] + vectors[3])
    job_bytes = 10_000                     # a 40 KB vector: 5 blocks of 8 KB...
    local_dir = PythonJobs.of(sc).local_dir
    assert local_dir == sc._temp_dir                    # the session's local[2]: files
    in_files = ShuffleAllReduce(size, np.float32, 5, job_bytes=job_bytes)
    with JobCounter(sc) as jobs:
        assert np.array_equal(in_files.run(index, local_fn).vector, whole.vector)
    assert jobs.count == 1 and not [f for f in os.listdir(local_dir) if "sparkdl-sum" in f]
    # each map task's vector went to one file (the shuffle carried its name), kept until the
    # result is final (a miss's completion reads them again), then removed
    map_dir = in_files._map_dir
    assert os.path.dirname(map_dir) == local_dir
    files = os.listdir(map_dir)
    assert len(files) == n and all(
        os.path.getsize(os.path.join(map_dir, f)) == size * 4 for f in files)
    in_files.settle()
    assert not os.path.exists(map_dir) and in_files._map_dir is None
    whole_reduce.settle()
    monkeypatch.setattr(PythonJobs.of(sc), "_local_dir", None)   # as on a cluster: one per job
    blocks = shuffle_blocks(size * 4, n, job_bytes)
    assert blocks == 5                 # (in 5 jobs: not rounded up to whole waves of 4)
    pieces = ShuffleAllReduce(size, np.float32, blocks, job_bytes=job_bytes)
    assert len(pieces.job_blocks) == 5 and job_intake(size * 4, "shuffle", n, None,
                                                      job_bytes) <= job_bytes
    computed.value = 0
    with JobCounter(sc) as jobs:
        result = pieces.run(index, local_fn)
    assert jobs.count == 5 and computed.value == n      # the map side ran once
    assert np.array_equal(result.vector, whole.vector)
    assert [r.partition for r in result.reports] == list(range(n))
    two = ShuffleAllReduce(size, np.float32, blocks, job_bytes=2 * 8_004)   # ...or two a job
    assert [len(g) for g in two.job_blocks] == [2, 2, 1]
    with JobCounter(sc) as jobs:
        assert np.array_equal(two.run(index, local_fn).vector, whole.vector)
    assert jobs.count == 3


def test_large_values_are_broadcast_in_pieces_and_read_back_whole(sc):
    """Issue 54: a value above the piece size goes as broadcasts of at most that size (the
    driver's JVM cuts and executors assemble one at a time); a task reads the value itself,
    numpy arrays rebuilt on the assembled buffers, bytes as a bytearray."""
    from sparkdl.transport.pieced_broadcast import FileValue, PiecedValue, pieced_broadcast
    from sparkdl.transport.python_jobs import PythonJobs

    rng = np.random.default_rng(1)
    value = {"w": rng.normal(size=50_000).astype(np.float32), "b": np.arange(7),
             "note": "x" * 1000}
    raw = rng.bytes(70_001)
    made = []

    def broadcast(v):
        made.append(len(v) if isinstance(v, bytes) else None)
        return PythonJobs.of(sc)._one_broadcast(v)

    handle = pieced_broadcast(broadcast, value, piece_bytes=64 << 10)
    raw_handle = pieced_broadcast(broadcast, raw, piece_bytes=64 << 10)
    assert isinstance(handle, PiecedValue) and isinstance(raw_handle, PiecedValue)
    # the pickle stream, the 200,000 bytes of "w" in four pieces, those of "b"; the raw bytes
    assert all(m is not None and m <= 64 << 10 for m in made) and len(made) == 6 + 2
    small = pieced_broadcast(broadcast, value["b"], piece_bytes=64 << 10)
    assert not isinstance(small, PiecedValue)             # one ordinary broadcast

    def read(_):
        got = handle.value
        data = raw_handle.value
        yield (got["w"].tobytes() == value["w"].tobytes(), got["b"].tolist(), got["note"],
               type(data).__name__, bytes(data) == raw, small.value.tolist())

    rows = sc.parallelize(range(2), 2).mapPartitions(read).collect()
    assert rows == [(True, list(range(7)), "x" * 1000, "bytearray", True, list(range(7)))] * 2
    for h in (handle, raw_handle, small):
        h.destroy(blocking=True)
    # on a local master the tasks run on the driver's machine: a large value is a file there,
    # read by the tasks, nothing of it in the JVM (no broadcast at all), removed on destroy
    made.clear()
    handle = pieced_broadcast(broadcast, value, piece_bytes=64 << 10, local_dir=sc._temp_dir)
    raw_handle = pieced_broadcast(broadcast, raw, piece_bytes=64 << 10, local_dir=sc._temp_dir)
    assert isinstance(handle, FileValue) and not made
    assert os.path.getsize(handle.path) == handle.nbytes

    def read_files(_):
        got, data = handle.value, raw_handle.value
        yield got["w"].tobytes() == value["w"].tobytes(), got["note"], bytes(data) == raw

    rows = sc.parallelize(range(2), 2).mapPartitions(read_files).collect()
    assert rows == [(True, "x" * 1000, True)] * 2
    handle.destroy()
    raw_handle.destroy()
    assert not os.path.exists(handle.path) and not os.path.exists(raw_handle.path)
    assert PythonJobs.of(sc)._local_dir == sc._temp_dir         # the session's local[2]
    # a flat uint8 array (a round's state vector) goes as its own bytes; a task maps its file
    state = rng.integers(0, 256, 100_000, dtype=np.uint8)
    state_handle = pieced_broadcast(broadcast, state, piece_bytes=64 << 10,
                                    local_dir=sc._temp_dir)
    assert state_handle.raw and os.path.getsize(state_handle.path) == state.nbytes

    def map_state(_):
        mapped = state_handle.mapped()
        yield type(mapped).__name__, mapped.flags.writeable, mapped.tobytes() == state.tobytes()

    assert sc.parallelize(range(2), 2).mapPartitions(map_state).collect() == \
        [("memmap", True, True)] * 2
    # ... and reads back as an array of those bytes, from its file or from pieces (validation
    # weights: a task's evaluation loads them as an array)
    pieces_handle = pieced_broadcast(broadcast, state, piece_bytes=64 << 10)
    assert isinstance(pieces_handle, PiecedValue)

    def read_state(_):
        for held in (state_handle, pieces_handle):
            got = held.value
            yield type(got).__name__, got.flags.writeable, got.tobytes() == state.tobytes()

    assert sc.parallelize(range(2), 2).mapPartitions(read_state).collect() == \
        [("ndarray", True, True)] * 4
    pieces_handle.destroy(blocking=True)
    state_handle.destroy()


def test_records_blocks_and_pieces_stay_within_the_record_budget(sc, monkeypatch):
    """spark.sparkdl.maxRecordBytes bounds what any one JVM record carries, whatever the
    vector's size: a block is at most the budget (a vector above 200 budgets gets one block per
    budget; 200 blocks stay the most a job's share of the sums makes), a block and a reducer's
    sum travel in frames of at most the budget, a broadcast in pieces of at most it. The sums
    through the JVM are bitwise the one-block sum, on both paths."""
    from models import JobCounter
    from sparkdl.spark_settings import MAX_RECORD_BYTES
    from sparkdl.transport.allreduce import (DriverAllReduce, ShuffleAllReduce, ShuffleMapSide,
                                             shuffle_blocks)
    from sparkdl.transport.pieced_broadcast import PiecedValue
    from sparkdl.transport.python_jobs import PythonJobs

    mib = 1 << 20
    assert shuffle_blocks(10 << 30, 2) == 320                 # 32 MiB blocks by default
    assert shuffle_blocks(10 << 30, 2, job_bytes=mib) == 320  # the budget wins over the cap
    assert shuffle_blocks(400 * mib, 2, job_bytes=mib) == 200  # a job's share: 200 at most
    assert shuffle_blocks(100 * mib, 2, record_bytes=mib) == 100
    assert shuffle_blocks(100 * mib, 120, record_bytes=mib) == 120
    # more blocks than partitions: whole waves of reducers (3 of 32 MiB on 2 slots leave one
    # slot idle in a second wave; 4 do not), unless that passes the unsorted writes' 200, adds
    # jobs for the sums (each job runs its own reducers) or the blocks were the user's
    assert shuffle_blocks(80 * mib, 2) == 4 and shuffle_blocks(76 * mib, 3) == 3
    assert shuffle_blocks(199 * mib, 3, record_bytes=mib) == 199
    assert shuffle_blocks(101 * mib, 2, record_bytes=mib) == 102
    assert shuffle_blocks(80 * mib, 2, job_bytes=100 * mib) == 4
    assert shuffle_blocks(80 * mib, 2, job_bytes=50 * mib) == 4       # 2 jobs, not 3
    assert shuffle_blocks(9 * mib, 8, job_bytes=mib) == 9        # 16 would take 16 jobs
    assert shuffle_blocks(80 * mib, 2, whole_waves=False) == 3
    n, size, record = 3, 10_001, 4_000
    vectors = _vectors(n, size)
    local_fn = lambda p, _: (vectors[p], _Report(p, False))       # noqa: E731
    allreduce = ShuffleAllReduce(size, np.float32, 2, record_bytes=record)
    side = ShuffleMapSide(local_fn, allreduce.bounds, allreduce.num_blocks, allreduce.codec,
                          allreduce.row_bounds, None, record)
    items = list(side(1, iter([None])))
    sizes = [len(memoryview(item).cast("B")) for item in items[1::2]]    # keys between frames
    assert max(sizes) == record and sum(s for s in sizes if s == record) == 10 * record
    monkeypatch.setattr(PythonJobs.of(sc), "_local_dir", None)      # as on a cluster
    index = sc.parallelize(range(n), n).cache()
    with JobCounter(sc) as jobs:
        assert np.array_equal(allreduce.run(index, local_fn).vector, _expected_sum(vectors))
    assert jobs.count == 1
    allreduce.settle()
    assert np.array_equal(DriverAllReduce(size, np.float32, record_bytes=record)
                          .run(index, local_fn).vector, _expected_sum(vectors))
    value = np.arange(800_000, dtype=np.float32)
    conf = sc._jsc.sc().conf()
    conf.set(MAX_RECORD_BYTES, "1m")                     # the least the setting accepts
    try:
        handle = PythonJobs.of(sc).broadcast(value)
    finally:
        conf.remove(MAX_RECORD_BYTES)
    # the pickle stream, and the array's 3,200,000 bytes in four pieces
    assert isinstance(handle, PiecedValue) and len(handle.pieces) == 5
    assert sc.parallelize(range(2), 2).map(
        lambda _: handle.value.tobytes() == value.tobytes()).collect() == [True, True]
    handle.destroy(blocking=True)


def test_a_result_stream_cut_short_is_an_error(sc):
    """The JVM ends a job's result stream by closing it, so a stream cut between two messages
    looks like its end: a reader told how many messages the job yields refuses fewer (or
    more), and a stream cut inside a message is refused always, at the driver and in a
    reducer's stream of frames."""
    from sparkdl.transport import frames as spark_frames

    def emit(partition, records):
        list(records)
        yield from spark_frames.message_frames((partition, "whole"), np.arange(3, dtype=np.int64))
        if partition == 1:                        # a header promising two frames, then one
            yield spark_frames.header(((partition, "cut"), 2))
            yield b"only one frame"

    whole = spark_frames.raw_output(sc.parallelize(range(2), 2).mapPartitionsWithIndex(
        lambda p, it: emit(0, it)))
    assert len(spark_frames.collect_messages(whole, lambda head: None, expected=2)) == 2
    with pytest.raises(EOFError, match="ended after 2 messages, but its job yields 3"):
        spark_frames.collect_messages(whole, lambda head: None, expected=3)
    with pytest.raises(EOFError, match="ended after 2 messages, but its job yields 1"):
        spark_frames.collect_messages(whole, lambda head: None, expected=1)
    cut = spark_frames.raw_output(sc.parallelize(range(2), 2).mapPartitionsWithIndex(emit))
    for destination in (lambda head: None,
                        lambda head: bytearray(100) if head[1] == "cut" else None):
        with pytest.raises(EOFError, match=r"inside a message of \(1, 'cut'\): 1 of its 2 "):
            spark_frames.collect_messages(cut, destination)
    frames = list(spark_frames.message_frames("block", np.arange(3, dtype=np.int64)))
    assert list(spark_frames.read_messages(frames))[0][1] == np.arange(3).tobytes()
    with pytest.raises(EOFError, match="inside a message of 'block': 0 of its 1 payload"):
        list(spark_frames.read_messages(frames[:1]))


@pytest.mark.parametrize("where", ["files", "jvm"])
def test_an_allreduce_missing_a_blocks_sum_raises(sc, monkeypatch, where):
    """The summed vector starts uninitialised: a block's sum that never came, or a reducer
    that returned none while the others did, is an error, never uninitialised values in the
    gradient; on the driver path a partition's vector that never came is one too."""
    from cut_streams import DriverMapGone, ReducerEmpty, ReducerGone
    from sparkdl.transport import allreduce as allreduce_module
    from sparkdl.transport.allreduce import DriverAllReduce, ShuffleAllReduce
    from sparkdl.transport.python_jobs import PythonJobs

    if where == "jvm":
        monkeypatch.setattr(PythonJobs.of(sc), "_local_dir", None)    # as on a cluster
    n, size = 3, 1001
    vectors = _vectors(n, size)
    index = sc.parallelize(range(n), n)
    local_fn = lambda p, _: (vectors[p], _Report(p, False))       # noqa: E731
    for cut, message in [(ReducerGone, "ended after 2 messages, but its job yields 3"),
                         (ReducerEmpty, r"reducers of blocks \[1\] returned no sum while "
                                         "those of 2 other blocks did")]:
        monkeypatch.setattr(allreduce_module, "ShuffleReduceSide", cut)
        allreduce = ShuffleAllReduce(size, np.float32, 3)
        with pytest.raises(EOFError, match=message):
            allreduce.run(index, local_fn)
        allreduce.settle()
    if where == "files":    # the driver path's results travel through the JVM either way
        monkeypatch.setattr(allreduce_module, "DriverMapSide", DriverMapGone)
        with pytest.raises(EOFError, match="ended after 2 messages, but its job yields 3"):
            DriverAllReduce(size, np.float32).run(index, local_fn)
