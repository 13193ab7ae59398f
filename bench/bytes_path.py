"""A gradient's and the weights' way through one iteration, hop by hop, at 1, 16 and 76 MiB.

    python bench/bytes_path.py                                   # local[2], 1 16 76 MiB
    python bench/bytes_path.py --master 'local-cluster[2,1,1024]' --conf spark.executor.memory=1g
    python bench/bytes_path.py --conf spark.shuffle.compress=false --conf spark.broadcast.compress=false

Two kinds of hop, in the order an iteration takes them:

* Spark hops, from timestamps taken on the driver and in the tasks (one machine, one clock)
  during jobs shaped like the engine's shuffle iteration, built from the engine's own pieces
  (:mod:`sparkdl.transport.frames`, :func:`~sparkdl.transport.allreduce.sum_in_order`): the
  driver broadcasts a state vector of ``V`` bytes; each of ``P`` map tasks reads it, takes its
  gradient (already in its Python worker, plus nothing) and writes it as ``P`` keyed blocks; each
  reducer reads its block of every task, sums them in partition order and yields the sum; the
  driver collects the sums into one vector. The job's launch carries no vector bytes; the span
  from the map tasks' last frame to the reducers' start is the JVM committing the map output
  (the rest of the shuffle write) and the switch to the reduce stage. Both are shown so that the
  hops add up to the job.
* In-process hops of :class:`sparkdl.transport.flat_layout.ParamLayout` on an MLP of about
  ``V`` bytes of parameters: the driver's model into the state vector, the state vector into a
  replica, the task's ``.grad`` into its flat vector, the driver's summed vector into ``.grad``.

Each figure is a median over ``--repeats`` iterations after warm-up ones (two for the Spark
hops, five for the layout hops; and ``--warmup-jobs`` trivial jobs before the first size), in ms, beside the bytes that cross the hop
per iteration and the vector-sized copies it makes (by the code path, listed in ``COPIES``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from typing import Any, Callable, Iterator

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scaling_model import _median_time as median_seconds  # noqa: E402
from sparkdl.datasets.reference_models import mlp  # noqa: E402
from sparkdl.transport.allreduce import block_bounds, sum_in_order  # noqa: E402
from sparkdl.transport.codecs import ExactCodec  # noqa: E402
from sparkdl.transport.flat_layout import ParamLayout  # noqa: E402
from sparkdl.transport import frames as spark_frames  # noqa: E402
from sparkdl.transport.frames import (keyed_frame, message_frames, raw_output,  # noqa: E402
                                      read_messages, shuffle_frames)

COLLECT_INTO_PLACE = hasattr(spark_frames, "collect_messages")
"""The sums are read from the result socket into the vector where the engine does so."""

PARTITIONS = 2

HOPS = [
    ("driver model -> state vector", "V"),
    ("sc.broadcast(state) on the driver", "V"),
    ("job launch (no bytes)", "-"),
    ("broadcast -> task Python", "V per executor"),
    ("state vector -> replica", "V per task"),
    ("task .grad -> flat vector", "V per task"),
    ("task Python -> executor JVM, shuffle write", "P*V"),
    ("map output commit, stage switch", "(P*V on disk)"),
    ("shuffle read -> reducer Python", "P*V"),
    ("reducer sum", "P*V"),
    ("reducer -> driver Python", "V"),
    ("driver frames -> one vector", "V"),
    ("driver vector -> p.grad", "V"),
]

COPIES = {
    "driver model -> state vector": "1",
    "sc.broadcast(state) on the driver": "2 (pickled into a file; the JVM's blocks, lz4 when on)",
    "job launch (no bytes)": "",
    "broadcast -> task Python": "2-4 (off-node: fetch, lz4 when on, a file; unpickled)",
    "state vector -> replica": "1",
    "task .grad -> flat vector": "1",
    "task Python -> executor JVM, shuffle write": "3-4 (socket; JVM buffer; file; lz4 when on)",
    "map output commit, stage switch": "",
    "shuffle read -> reducer Python": "3-4 (file; lz4 when on; JVM buffer; socket)",
    "reducer sum": "P - 1 (the first two added into a new vector, then the rest)",
    "reducer -> driver Python": ("4 (socket; task result, through the block store above "
                                 "spark.task.maxDirectResultSize; driver JVM; py4j socket)"),
    "driver frames -> one vector": ("0 where read from the socket into place "
                                    "(collect_messages), else 1"),
    "driver vector -> p.grad": "0 (views into the vector)",
}


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    return 1000 * median_seconds(fn, repeats)


def warm_up(sc: Any, jobs: int) -> None:
    """Trivial jobs until the JVM's paths are compiled (what a long session has)."""
    index = sc.parallelize(range(PARTITIONS), PARTITIONS)
    for _ in range(jobs):
        index.map(lambda x: x).collect()


def _cached_vector(n: int) -> np.ndarray:
    """The task's vector, made once per Python worker (a module in sys.modules outlives the
    task; a module-level dict of this file would be a fresh copy in every task), then the
    worker's objects frozen out of the per-task collection, as the engine's caches do."""
    cache = sys.modules.setdefault("_sparkdl_bench_vectors",
                                   types.ModuleType("_sparkdl_bench_vectors"))
    vector = getattr(cache, f"v{n}", None)
    if vector is None:
        # gradient-like values: lz4 gains little on them (a constant vector would shrink to
        # nothing and make compression look free)
        vector = np.random.default_rng(n).normal(size=n).astype(np.float32)
        setattr(cache, f"v{n}", vector)
        from sparkdl.executor.worker_cache import freeze_long_lived
        freeze_long_lived()
    return vector


def spark_hops(sc: Any, n: int, repeats: int) -> dict[str, float]:
    """ms per Spark hop for vectors of ``n`` float32, from timestamps taken in the tasks and on
    the driver during jobs shaped like the engine's iteration (see the module docstring)."""
    index = sc.parallelize(range(PARTITIONS), PARTITIONS).cache()
    index.count()
    bounds = block_bounds(n, PARTITIONS)
    codec = ExactCodec(np.dtype(np.float32))
    state = np.random.default_rng(0).normal(size=n).astype(np.float32).view(np.uint8)

    def iteration() -> dict[str, float]:
        t_submit = time.time()
        t0 = time.perf_counter()
        bc = sc.broadcast(state)
        broadcast_ms = 1000 * (time.perf_counter() - t0)

        def map_side(partition: int, records: Iterator[Any]) -> Iterator[Any]:
            list(records)       # a worker that leaves its input unread is not reused
            started = time.time()
            weights = bc.value
            read = time.time()
            vector = _cached_vector(n) + 0 * float(weights[0])   # the task's gradient
            ready = time.time()
            for k in range(PARTITIONS):
                for frame in message_frames((partition, None), vector[bounds[k]:bounds[k + 1]]):
                    yield from keyed_frame(k, frame)
            written = time.time()
            for frame in message_frames((partition, (started, read, ready, written)), None):
                yield from keyed_frame(0, frame)

        def reduce_side(k: int, frames: Iterator[bytes]) -> Iterator[Any]:
            called = time.time()
            parts, maps = [], []
            for (partition, times), payload in read_messages(frames):
                if times is None:
                    parts.append((partition, payload))
                else:
                    maps.append(times)
            received = time.time()
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            total = sum_in_order(parts, codec, lo, hi - lo)
            summed = time.time()
            yield from message_frames((k, maps, (called, received, summed)), total)

        mapped = raw_output(index.mapPartitionsWithIndex(map_side))
        reduced = raw_output(shuffle_frames(mapped, PARTITIONS).mapPartitionsWithIndex(
            reduce_side))
        out = np.empty(n, dtype=np.float32)
        if COLLECT_INTO_PLACE:          # as ShuffleAllReduce does
            messages = spark_frames.collect_messages(reduced, lambda head: out[bounds[head[0]]:
                                                                  bounds[head[0] + 1]])
            returned = time.time()
        else:                           # collect() into bytes, then into the vector
            messages = list(read_messages(reduced.collect()))
            returned = time.time()
            for (k, _, _), payload in messages:
                out[bounds[k]:bounds[k + 1]] = np.frombuffer(payload, dtype=np.float32)
        maps, reducers = [], []
        for (k, map_times, reducer_times), _ in messages:
            maps.extend(map_times)
            reducers.append(reducer_times)
        assembled = time.time()
        bc.destroy(blocking=False)
        started, read, ready, written = (max(t[i] for t in maps) for i in range(4))
        called, received, summed = (max(t[i] for t in reducers) for i in range(3))
        ms = lambda a, b: 1000 * (b - a)  # noqa: E731
        return {
            "sc.broadcast(state) on the driver": broadcast_ms,
            "job launch (no bytes)": ms(t_submit, started) - broadcast_ms,
            "broadcast -> task Python": 1000 * max(t[1] - t[0] for t in maps),
            "task Python -> executor JVM, shuffle write": 1000 * max(t[3] - t[2] for t in maps),
            "map output commit, stage switch": ms(written, called),
            "shuffle read -> reducer Python": ms(called, received),
            "reducer sum": ms(received, summed),
            "reducer -> driver Python": ms(summed, returned),
            "driver frames -> one vector": ms(returned, assembled),
        }

    for _ in range(2):
        iteration()
    runs = [iteration() for _ in range(repeats)]
    index.unpersist()
    return {hop: statistics.median(r[hop] for r in runs) for hop in runs[0]}


def bytes_floor(sc: Any, nbytes: int, repeats: int = 5) -> float:
    """Milliseconds of one iteration's moves of an ``nbytes`` gradient through Spark with
    nothing computed: the sum of :func:`spark_hops` (medians of ``repeats`` each), for the
    benches that print it beside sparkdl's iteration (``compare_runners.py``,
    ``large_models.py --floor``)."""
    if __name__ != "__main__":          # imported: its task functions travel by value, since
        from pyspark import cloudpickle  # the workers cannot import bench/
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return float(sum(spark_hops(sc, max(1, int(nbytes) // 4), repeats).values()))


def layout_hops(n: int, repeats: int) -> dict[str, float]:
    """ms per in-process layout hop on an MLP with about ``n`` parameters."""
    hidden = max(16, int((-(784 + 10 + 1) + ((784 + 10 + 1) ** 2 + 4 * n) ** 0.5) / 2))
    torch.manual_seed(0)
    net = mlp([784, hidden, hidden, 10])
    layout = ParamLayout(net)
    out = net(torch.randn(8, 784))
    out.sum().backward()
    replica = mlp([784, hidden, hidden, 10])
    state = layout.state_vector(net)
    vector, present = layout.gradients(net)

    def set_grads() -> None:
        layout.set_grads(net, vector, present)

    return {
        "task .grad -> flat vector": median_ms(lambda: layout.gradients(net), repeats),
        "driver vector -> p.grad": median_ms(set_grads, repeats),
        "driver model -> state vector": median_ms(lambda: layout.state_vector(net), repeats),
        "state vector -> replica": median_ms(lambda: layout.load_state(replica, state), repeats),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, nargs="+", default=[1, 16, 76])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup-jobs", type=int, default=300,
                   help="trivial jobs before timing (0: a cold JVM)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the session (repeatable)")
    args = p.parse_args()
    from sparkdl.spark_settings import spark_session

    settings = {"spark.ui.enabled": "false"}
    settings.update(dict(c.split("=", 1) for c in args.conf))
    spark = spark_session("sparkdl bench: bytes path", args.master, settings)
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    torch.set_num_threads(1)
    warm_up(sc, args.warmup_jobs)
    results: dict[float, dict[str, float]] = {}
    for mib in args.mib:
        n = int(mib * 2**20 / 4)
        results[mib] = {**layout_hops(n, args.repeats), **spark_hops(sc, n, args.repeats)}
        print(f"{mib:g} MiB done", file=sys.stderr, flush=True)
    print(f"master {args.master}, {args.warmup_jobs} warm-up jobs, settings "
          f"{args.conf or 'default'}, P = {PARTITIONS} tasks, median of {args.repeats}, ms")
    print("| hop | bytes per iteration | vector copies | "
          + " | ".join(f"{m:g} MiB" for m in args.mib) + " |")
    print("|---|---|---|" + "---:|" * len(args.mib))
    for hop, moved in HOPS:
        print(f"| {hop} | {moved} | {COPIES[hop]} | "
              + " | ".join(f"{results[m][hop]:.1f}" for m in args.mib) + " |")
    total = {m: sum(results[m].values()) for m in args.mib}
    print("| **sum of hops** | | | " + " | ".join(f"**{total[m]:.0f}**" for m in args.mib) + " |")
    spark.stop()


if __name__ == "__main__":
    main()
