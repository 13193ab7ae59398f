"""The engine's per-iteration Python jobs, built on Spark's JVM classes at a few py4j calls each.

Every training iteration is one Spark job over the same tiny index RDD. Built the usual way,
``rdd.mapPartitionsWithIndex(f).collect()``, an iteration cost the driver 34 py4j round trips
(W1 on the driver path; bench/compare_runners.py counts them): every ``sc._jvm.PythonRDD.x``
access looks the class and then the member up by reflection, Python lists and dicts are
converted to Java element by element, the call site is found from the stack and set and cleared,
and ``f``, a closure, is cloudpickled by value. :class:`PythonJobs` builds the same JVM objects
(a ``SimplePythonFunction`` and a ``PythonRDD`` over the parent's JVM RDD) with class and member
handles looked up once per SparkContext and the environment and includes converted again only
when they change, from functions that are instances of importable classes (pickled by reference
to their class, plus their small fields): 19 round trips an iteration, the broadcast included.

What a Python worker receives is what ``PipelinedRDD`` sends for the same function: the command
``(func, None, deserializer, serializer)``, its broadcasts, the same environment, includes and
Python executable; a command over Spark's broadcast threshold travels as a broadcast, as there.
Only the driver's way of building the job changes, so tasks, retries, speculation and resource
profiles behave as before. One difference: with ``spark.python.profile=true`` pyspark profiles
the Python side of the jobs its RDD API builds; these jobs are not profiled.

Example::

    jobs = PythonJobs.of(sc)
    index = jobs.rdd(index_rdd)                       # the JVM side of a (cached) pyspark RDD
    mapped = jobs.map_partitions(index, MapSide(...))     # yields frames (bytes-like objects)
    shuffled = shuffle_frames(mapped, num_blocks)           # sparkdl.transport.frames
    messages = collect_messages(jobs.map_partitions(shuffled, ReduceSide(...)), destination)
"""

from __future__ import annotations

import os
import tempfile
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from pyspark import Broadcast
from pyspark.serializers import CloudPickleSerializer, NoOpSerializer

from ..spark_settings import MAX_RECORD_BYTES, max_record_bytes_setting, spark_setting
from .pieced_broadcast import pieced_broadcast

__all__ = ["IterationJobs", "JobRdd", "PythonJobs", "user_call_site"]

_PYTHON = "org.apache.spark.api.python."


@dataclass(frozen=True, eq=False)       # compared by identity: no JVM calls to compare
class JobRdd:
    """A JVM RDD (``org.apache.spark.rdd.RDD``) of Python data, with the serializer its Python
    side reads it with (:class:`pyspark.serializers.NoOpSerializer`: frames as ``bytes``)."""

    jobs: "PythonJobs"
    jrdd: Any
    deserializer: Any


class PythonJobs:
    """Builds and runs Python RDD jobs on one SparkContext (see the module docstring); one
    instance per context, from :meth:`of`."""

    _lock = threading.Lock()

    def __init__(self, sc: Any) -> None:
        from py4j.java_collections import ListConverter, MapConverter

        self.sc = sc
        jvm, client = sc._jvm, sc._gateway._gateway_client
        python_rdd = getattr(jvm, _PYTHON + "PythonRDD")
        self._function = getattr(jvm, _PYTHON + "SimplePythonFunction")
        self._python_rdd = python_rdd
        self._pairwise = getattr(jvm, _PYTHON + "PairwiseRDD")
        self._partitioner = getattr(jvm, _PYTHON + "PythonPartitioner")
        self._collect_and_serve = python_rdd.collectAndServe
        self._setup_broadcast = python_rdd.setupBroadcast
        self._value_of_pair = python_rdd.valueOfPair
        self._threshold = int(getattr(jvm, _PYTHON + "PythonUtils")
                              .getBroadcastThreshold(sc._jsc))
        self._to_map = lambda items: MapConverter().convert(items, client)
        self._to_list = lambda items: ListConverter().convert(items, client)
        self._env: tuple[Any, Any] = (None, None)          # (Python value, its Java copy)
        self._includes: tuple[Any, Any] = (None, None)
        self._serializer = CloudPickleSerializer()
        master = str(sc.master)
        self._local_dir = (sc._temp_dir if master.startswith("local")
                           and not master.startswith("local-cluster")
                           and not sc._encryption_enabled else None)
        """Where a large value goes as a file for the tasks (a local master: they run here)."""

    @property
    def local_dir(self) -> str | None:
        """Where large values go as files between the driver's Python and its tasks: the
        context's temporary directory on a local master (the tasks run on this machine; not
        under I/O encryption), else None."""
        return self._local_dir

    @classmethod
    def of(cls, sc: Any) -> "PythonJobs":
        """The instance for ``sc`` (made on first use, kept on the context)."""
        with cls._lock:
            jobs = getattr(sc, "_sparkdl_python_jobs", None)
            if jobs is None or jobs.sc is not sc:
                jobs = cls(sc)
                sc._sparkdl_python_jobs = jobs
            return jobs

    def rdd(self, rdd: Any) -> JobRdd:
        """The JVM side of a pyspark ``RDD`` (one py4j call; keep it for later jobs)."""
        return JobRdd(self, rdd._jrdd.rdd(), rdd._jrdd_deserializer)

    def map_partitions(self, parent: JobRdd, func: Callable[[int, Any], Any],
                       resources: Any = None) -> JobRdd:
        """``parent.mapPartitionsWithIndex(func)`` whose output is frames (what ``func`` yields,
        bytes-like, written as is; :func:`sparkdl.transport.frames.raw_output`), in a stage that
        asks for ``resources`` (a :class:`pyspark.resource.ResourceProfile`) when given."""
        sc = self.sc
        output = NoOpSerializer()
        command = self._serializer.dumps((func, None, parent.deserializer, output))
        if len(command) > self._threshold:   # as pyspark: a large command travels as a broadcast
            command = self._serializer.dumps(sc.broadcast(command))
        broadcasts = [b._jbroadcast for b in sc._pickled_broadcast_vars]
        sc._pickled_broadcast_vars.clear()
        env, includes = self._env, self._includes     # each pair replaced whole (threads)
        if env[0] != sc.environment:          # converted again only when they change
            env = self._env = (dict(sc.environment), self._to_map(dict(sc.environment)))
        if includes[0] != sc._python_includes:             # sc.addPyFile adds includes
            includes = self._includes = (list(sc._python_includes),
                                         self._to_list(list(sc._python_includes)))
        function = self._function(bytearray(command), env[1], includes[1], sc.pythonExec,
                                  sc.pythonVer, self._to_list(broadcasts), sc._javaAccumulator)
        jrdd = self._python_rdd(parent.jrdd, function, False, False)
        if resources is not None:
            jrdd.withResources(_java_profile(sc, resources))
        return JobRdd(self, jrdd, output)

    def partition_frames(self, keyed: JobRdd, num_partitions: int, partitioner_id: int
                         ) -> JobRdd:
        """The shuffle of :func:`sparkdl.transport.frames.shuffle_frames` on JVM RDDs."""
        pairs = self._pairwise(keyed.jrdd).asJavaPairRDD()
        shuffled = pairs.partitionBy(self._partitioner(int(num_partitions), partitioner_id))
        return JobRdd(self, self._value_of_pair(shuffled).rdd(), NoOpSerializer())

    def broadcast(self, value: Any, record_bytes: int | None = None) -> Any:
        """``sc.broadcast(value)`` (a pyspark ``Broadcast``, the same in tasks and to destroy)
        without its two reflection look-ups per call; with I/O encryption on, pyspark's own. A
        value above ``record_bytes`` (None: :meth:`record_bytes`, read from the running
        configuration; a caller that broadcasts every iteration reads it once and passes it)
        goes in pieces of at most that, or on a local master as a file the tasks read
        (:func:`~sparkdl.transport.pieced_broadcast.pieced_broadcast`: a handle with the same
        ``value`` and ``destroy``)."""
        return pieced_broadcast(self._one_broadcast, value,
                                self.record_bytes() if record_bytes is None else record_bytes,
                                local_dir=self._local_dir)

    def record_bytes(self) -> int:
        """The most bytes of a vector one record, block or broadcast piece carries through a
        JVM (``spark.sparkdl.maxRecordBytes`` of the running configuration)."""
        return max_record_bytes_setting(spark_setting(self.sc, MAX_RECORD_BYTES) or None)

    def _one_broadcast(self, value: Any) -> Any:
        if self.sc._encryption_enabled:
            return self.sc.broadcast(value)
        return _DriverBroadcast(self, value)

    def serve(self, rdd: JobRdd, call_site: str, partitions: list[int] | None = None) -> Any:
        """Run the job that collects ``rdd`` (only ``partitions``, when given) and return the
        socket its results are served on (``PythonRDD.collectAndServe``, or ``runJob``), the
        job named ``call_site`` in Spark's UI."""
        jsc = self.sc._jsc
        jsc.setCallSite(call_site)
        try:
            if partitions is None:
                return self._collect_and_serve(rdd.jrdd)
            return self._python_rdd.runJob(jsc.sc(), rdd.jrdd.toJavaRDD(),
                                           self._to_list([int(p) for p in partitions]))
        finally:
            jsc.setCallSite(None)


class _DriverBroadcast(Broadcast):
    """A driver-side pyspark ``Broadcast`` made as ``Broadcast.__init__`` makes one without
    encryption (the value pickled into a file under the context's temporary directory, then
    ``PythonRDD.setupBroadcast`` and ``JavaSparkContext.broadcast``), through the cached
    handle of :class:`PythonJobs`."""

    def __init__(self, jobs: PythonJobs, value: Any) -> None:    # replaces Broadcast.__init__
        sc = jobs.sc
        out = tempfile.NamedTemporaryFile(delete=False, dir=sc._temp_dir)
        self._path = out.name
        self._sc = sc
        self._python_broadcast = jobs._setup_broadcast(self._path)
        self.dump(value, out)                   # closes the file
        self._jbroadcast = sc._jsc.broadcast(self._python_broadcast)
        self._pickle_registry = sc._pickled_broadcast_vars


def _java_profile(sc: Any, profile: Any) -> Any:
    """The JVM resource profile of a pyspark ``ResourceProfile`` (as ``RDD.withResources``)."""
    if profile._java_resource_profile is not None:
        return profile._java_resource_profile
    from pyspark.resource.requests import ExecutorResourceRequests, TaskResourceRequests

    builder = getattr(sc._jvm, "org.apache.spark.resource.ResourceProfileBuilder")()
    builder.require(ExecutorResourceRequests(sc._jvm, profile._executor_resource_requests)
                    ._java_executor_resource_requests)
    builder.require(TaskResourceRequests(sc._jvm, profile._task_resource_requests)
                    ._java_task_resource_requests)
    return builder.build()


class IterationJobs:
    """What the jobs of one training run share from iteration to iteration: the JVM side of
    the index RDD (looked up again only when the RDD is replaced, e.g. after a rebuild) and
    the name of the jobs in Spark's UI (``label`` at the user's call site, found once)."""

    def __init__(self, label: str) -> None:
        self.call_site = user_call_site(label)
        self._rdd: Any = None
        self._index: JobRdd | None = None
        self.num_partitions = 0
        """The index RDD's number of partitions (of the last :meth:`index`)."""

    def index(self, rdd: Any) -> JobRdd:
        """The :class:`JobRdd` of the pyspark ``RDD`` ``rdd``."""
        if rdd is not self._rdd or self._index is None:
            self._index = PythonJobs.of(rdd.ctx).rdd(rdd)
            self.num_partitions = rdd.getNumPartitions()
            self._rdd = rdd
        return self._index


def _package_dir(module_file: str) -> str:
    return os.path.dirname(os.path.abspath(module_file)) + os.sep


_LIBRARIES = (os.path.dirname(_package_dir(__file__).rstrip(os.sep)) + os.sep,   # sparkdl/
              _package_dir(__import__("pyspark").__file__))


def user_call_site(label: str) -> str:
    """``label`` and the innermost frame of the caller's stack outside sparkdl and pyspark
    (``"label at file.py:12"``), as Spark's UI names a job."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_LIBRARIES) and not frame.filename.startswith("<"):
            return f"{label} at {os.path.basename(frame.filename)}:{frame.lineno}"
    return label
