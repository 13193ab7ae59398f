"""RDDs whose partition ``i`` asks Spark to run its task on executors the driver names.

``SparkContext.makeRDD(Seq[(T, Seq[String])])`` is the JVM API for a parallelized collection
with one element per partition and preferred locations per partition; a location
``executor_<host>_<id>`` asks for one executor (Spark's ``ExecutorCacheTaskLocation``, the
locality level of a cached block). pyspark does not wrap it, so :func:`targeted_rdd` builds it
through py4j (Scala 2.12 and 2.13 alike) and wraps it as a pyspark ``RDD`` of the pickled
elements. Spark keeps to the preferences as it does for cached blocks: a task waits up to
``spark.locality.wait`` for a preferred executor, then runs elsewhere.

:func:`single_task_jobs` runs chosen partitions of an RDD as one job each, a few at once: Spark
never starts a speculative copy of a stage's only task (unless
``spark.speculation.task.duration.threshold`` is set), so a copy cannot land on an executor the
driver did not choose, nor kill the Python worker of the attempt it beat.

Example::

    rdd = targeted_rdd(sc, [0, 1], [["executor_10.0.0.7_1"], ["executor_10.0.0.8_2"]])
    summaries = single_task_jobs(sc, rdd.map(build), [0, 1], keep)
"""

from __future__ import annotations

import pickle
import threading
from typing import Any, Callable, Hashable, Iterator, Sequence

from pyspark import RDD, InheritableThread
from pyspark.serializers import BatchedSerializer, CPickleSerializer

__all__ = ["single_task_jobs", "targeted_rdd"]


def _scala_list(jvm: Any, items: Sequence[Any]) -> Any:
    values = jvm.java.util.ArrayList()
    for item in items:
        values.add(item)
    return jvm.scala.collection.JavaConverters.asScalaBuffer(values).toList()


def targeted_rdd(sc: Any, items: Sequence[Any], locations: Sequence[Sequence[str]]) -> RDD:
    """A pyspark RDD with partition ``i`` holding ``items[i]`` alone and preferring
    ``locations[i]`` (Spark task locations: ``executor_<host>_<id>`` or a host name)."""
    if len(items) != len(locations):
        raise ValueError(f"{len(items)} items but {len(locations)} location lists")
    jvm = sc._jvm
    pairs = [jvm.scala.Tuple2(bytearray(pickle.dumps([item], protocol=pickle.HIGHEST_PROTOCOL)),
                              _scala_list(jvm, list(where)))
             for item, where in zip(items, locations)]
    tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("java.lang.Object"))
    jrdd = sc._jsc.sc().makeRDD(_scala_list(jvm, pairs), tag)
    return RDD(jvm.org.apache.spark.api.java.JavaRDD.fromRDD(jrdd, tag), sc,
               BatchedSerializer(CPickleSerializer(), 1))


def single_task_jobs(sc: Any, rdd: RDD, partitions: Sequence[int],
                     func: Callable[[Iterator[Any]], Iterator[Any]], at_once: int = 16,
                     lanes: Sequence[Hashable] | None = None) -> list[Any]:
    """``sc.runJob(rdd, func, [p])`` for each ``p`` of ``partitions``, at most ``at_once`` jobs
    at a time (threads that carry the caller's local properties, as
    :class:`pyspark.InheritableThread` does); the rows of all jobs, in the order of
    ``partitions``. ``lanes`` (one per partition: the executor a task targets) lets at most one
    job of each lane run at a time, so that a targeted task never waits behind another one for
    its executor until ``spark.locality.wait`` sends it elsewhere. After a failure no further
    job starts, and the first error is raised once the running ones end. ``func`` is shipped by
    reference: keep it in a light module."""
    lane_of = dict(zip(partitions, lanes)) if lanes is not None else {p: p for p in partitions}
    todo = list(partitions)
    rows: dict[int, list[Any]] = {}
    errors: list[BaseException] = []
    busy: set[Hashable] = set()
    ready = threading.Condition()

    def next_partition() -> int | None:
        with ready:
            while True:
                if errors or not todo:
                    return None
                p = next((p for p in todo if lane_of[p] not in busy), None)
                if p is not None:
                    todo.remove(p)
                    busy.add(lane_of[p])
                    return p
                ready.wait()

    def run() -> None:
        while (p := next_partition()) is not None:
            got: Any = None
            error: BaseException | None = None
            try:
                got = sc.runJob(rdd, func, [p])
            except BaseException as exc:  # raised in the caller's thread below
                error = exc
            with ready:
                if error is None:
                    rows[p] = got
                else:
                    errors.append(error)
                busy.discard(lane_of[p])
                ready.notify_all()

    threads = [InheritableThread(target=run) for _ in range(min(at_once, len(todo)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [row for p in partitions for row in rows[p]]
