"""RDDs whose partition ``i`` asks Spark to run its task on executors the driver names.

``SparkContext.makeRDD(Seq[(T, Seq[String])])`` is the JVM API for a parallelized collection
with one element per partition and preferred locations per partition; a location
``executor_<host>_<id>`` asks for one executor (Spark's ``ExecutorCacheTaskLocation``, the
locality level of a cached block). pyspark does not wrap it, so :func:`targeted_rdd` builds it
through py4j (Scala 2.12 and 2.13 alike) and wraps it as a pyspark ``RDD`` of the pickled
elements. Spark keeps to the preferences as it does for cached blocks: a task waits up to
``spark.locality.wait`` for a preferred executor, then runs elsewhere.

Example::

    rdd = targeted_rdd(sc, [0, 1], [["executor_10.0.0.7_1"], ["executor_10.0.0.8_2"]])
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

from pyspark import RDD
from pyspark.serializers import BatchedSerializer, CPickleSerializer

__all__ = ["targeted_rdd"]


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
