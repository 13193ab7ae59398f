"""The Spark settings sparkdl relies on, and a session builder that applies them.

``RECOMMENDED_CONF`` is what every sparkdl job should run with (README, "Spark settings"):

- ``spark.python.unix.domain.socket.enabled=true`` (pyspark 4.1+; older versions ignore it):
  the JVM talks to Python workers over a Unix socket; over loopback TCP each task waited ~40 ms
  for its first input bytes (Nagle / delayed ACK), once per task and so several times per
  iteration. (As the context stops, pyspark's daemon would print a ``BrokenPipeError``
  traceback for each idle worker on this socket: :mod:`sparkdl.executor.daemon_exit`.)
- ``spark.task.maxDirectResultSize=64m``: a task result above Spark's 1 MiB default is put in
  the executor's block manager and fetched from there by the driver, an extra store and read of
  every summed gradient block; up to 64 MiB (under the 128 MiB RPC message limit) it travels in
  the task's status message. Measured with ``bench/bytes_path.py`` on local[2]: the 76 MiB
  gradient's reducers-to-driver hop fell from 328 to 260 ms (bench/RESULTS.md).
- ``spark.ui.showConsoleProgress=false``: Spark's stage bar would fight sparkdl's own progress
  bar for the terminal line.

``CLUSTER_CONF`` is added on every master but a local one (``local-cluster``, standalone, YARN,
Kubernetes: executors in JVMs of their own):

- ``spark.memory.fraction=0.3`` (Spark's default 0.6): the share of a JVM's heap beyond its
  reserved 300 MiB that Spark's memory manager lends its block store and its tasks' execution
  memory. A model's weights reach the executors as broadcast pieces that the driver's and each
  executor's block store keep (:mod:`sparkdl.transport.pieced_broadcast`); a model larger than
  that pool fills it every iteration, and the gradient blocks, frames and task results that
  pass through the JVM then have the rest of the heap only. With 0.6, a 294 M-parameter MLP
  (1.1 GiB) on ``local-cluster[2,1,2048]`` with 2g executors and a 2g driver ran an executor's
  JVM out of heap at 32 MiB records and the driver's at 8 MiB; with 0.3 it trained at either,
  within 3.7e-09 of single-process torch (bench/RESULTS.md, "The cluster path"). On a local
  master large values are files and the pool stays Spark's.

``LOCAL_JAVA_OPTIONS`` (``-XX:TieredStopAtLevel=1``) is added to ``spark.driver.extraJavaOptions``
for a ``local[...]`` master started from plain Python, where the one JVM schedules the tasks and
shares the cores with the Python workers that compute them: HotSpot's optimizing compiler (C2)
spends the first hundreds of iterations compiling Spark's hot code on those cores and the tasks
run slower meanwhile. Stopping at the quick compiler (C1) made W2's first iterations 0.67x as
long on local[2] and its 300th the same (``bench/jvm_options.py``, bench/RESULTS.md); W3's 0.96x
and 0.91x. It is not applied where the session already has driver options, nor under
``spark-submit`` (the JVM has started) nor on cluster masters: long-lived executors with many cores
gain from C2 in the rest of the job (SQL, ETL), and ``spark.executor.extraJavaOptions`` is the
user's call there (README, "Spark settings").

Example::

    from sparkdl.spark_settings import spark_session
    spark = spark_session("my job")        # local[*] under plain python, spark-submit's master
                                           # (and its --conf values) under spark-submit
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable, Mapping

__all__ = ["RECOMMENDED_CONF", "CLUSTER_CONF", "LOCAL_JAVA_OPTIONS", "recommended_conf", "is_local_master",
           "speculation_never_fires", "spark_setting", "spark_session", "sets_pyspark_python",
           "shard_replicas",
           "SHARD_REPLICAS", "DRIVER_JOB_BYTES", "driver_job_bytes_setting", "spark_bytes",
           "MAX_RECORD_BYTES", "DEFAULT_RECORD_BYTES", "max_record_bytes_setting",
           "spark_flag", "spark_number", "RESERVED_HEAP", "storage_pool_bytes"]

RECOMMENDED_CONF: dict[str, str] = {
    "spark.python.unix.domain.socket.enabled": "true",
    "spark.task.maxDirectResultSize": "64m",
    "spark.ui.showConsoleProgress": "false",
}

CLUSTER_CONF: dict[str, str] = {
    "spark.memory.fraction": "0.3",
}
"""Added to :data:`RECOMMENDED_CONF` on masters other than a local one (module docstring)."""

LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""The driver JVM's options for a ``local[...]`` master (module docstring)."""


RESERVED_HEAP = 300 << 20
"""The part of a JVM's heap Spark's memory manager reserves for itself and never lends. Spark
refuses to start a heap below 1.5 times this but in its testing mode (which reserves less)."""


def storage_pool_bytes(heap: int, fraction: float = 0.6) -> int:
    """The most of a JVM heap of ``heap`` bytes (``Runtime.maxMemory``) that Spark's block store
    may fill with cached blocks and broadcast pieces: the unified pool, (``heap`` -
    :data:`RESERVED_HEAP`) x ``spark.memory.fraction`` (0.6 by default); storage borrows all of
    it while no task's execution memory needs it, and what it holds is no longer there for
    task results and records passing through (user memory, which no pool accounts for).

    Example: ``storage_pool_bytes(2048 << 20) >> 20`` is 1048 (MiB)."""
    return max(0, int((int(heap) - RESERVED_HEAP) * float(fraction)))


DRIVER_JOB_BYTES = "spark.sparkdl.driverJobBytes"
"""The most bytes of task results one job hands the driver (default: an eighth of its heap and
half of ``spark.driver.maxResultSize``: :func:`sparkdl.transport.allreduce.driver_job_bytes`).
Larger means fewer jobs per iteration for a large model, and a heap that must hold them; a value
above the driver's heap is refused before any job."""


def spark_bytes(value: str, default_unit: str = "m", setting: str | None = None) -> int:
    """A Spark size setting ("512m", "1g", "2048") in bytes; a bare number is in
    ``default_unit`` (Spark's unit for that setting). ``setting``: its name, for the error
    when ``value`` is not a size."""
    text = value.strip().lower()
    units = {"b": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50}
    if text.endswith("b") and len(text) > 1 and text[-2] in units:
        text = text[:-1]
    unit = text[-1] if text and text[-1] in units else default_unit
    number = text[:-1] if text and text[-1] in units else text
    try:
        return int(number) << units[unit]
    except ValueError:
        from .errors import InvalidArgumentError

        named = f" of {setting}" if setting else ""
        raise InvalidArgumentError(
            f"cannot read the Spark size {value!r}{named}: give a whole number with an "
            "optional unit (b, k, m, g, t, p), such as 512m or 2g") from None


def _positive_size(setting: str, value: str | None, refusal: str) -> int | None:
    """``value`` of ``setting`` in bytes (a bare number is bytes), None when unset; an
    :class:`~sparkdl.errors.InvalidArgumentError` naming the setting when it is not a size, or
    ``refusal`` (what the setting means) when it is not above 0."""
    if value is None or not str(value).strip():
        return None
    size = spark_bytes(str(value), "b", setting)
    if size <= 0:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"{setting}={value!r}: {refusal}")
    return size


def driver_job_bytes_setting(value: str | None) -> int | None:
    """``spark.sparkdl.driverJobBytes`` (:data:`DRIVER_JOB_BYTES`) in bytes (a bare number is
    bytes), None when it is not set; an :class:`~sparkdl.errors.InvalidArgumentError` naming
    the setting when its value is not a size above 0.

    Example: ``driver_job_bytes_setting(spark_setting(sc, DRIVER_JOB_BYTES) or None)``"""
    return _positive_size(
        DRIVER_JOB_BYTES, value,
        "the setting is the most bytes of task results one job may hand the driver, and no "
        "job's results fit in none. Give a size such as 256m, or leave it unset (by default "
        "an eighth of the driver's heap and half of spark.driver.maxResultSize).")


MAX_RECORD_BYTES = "spark.sparkdl.maxRecordBytes"
"""The most bytes of a vector one record carries through a JVM: a shuffle record (a frame a
task's Python hands its executor's JVM, or a reducer's), a block of the AllReduce (one
reducer's sum, the result of its task) and a broadcast piece (the weights seeded by the
driver's block manager, assembled by each executor's). A JVM then holds a few records at a
time for each task it runs, never the model. Default :data:`DEFAULT_RECORD_BYTES`; a value
that the executors' or the driver's heap cannot hold is refused before any job
(:mod:`sparkdl.engine.strategies.sync.pass_memory`)."""

DEFAULT_RECORD_BYTES = 32 << 20
"""The default of :data:`MAX_RECORD_BYTES`: 32 MiB (eight of Spark's 4 MiB torrent blocks a
broadcast piece)."""


MIN_RECORD_BYTES = 1 << 20
"""The least :data:`MAX_RECORD_BYTES` accepts: 1 MiB."""


def max_record_bytes_setting(value: str | None) -> int:
    """``spark.sparkdl.maxRecordBytes`` (:data:`MAX_RECORD_BYTES`) in bytes (a bare number is
    bytes), :data:`DEFAULT_RECORD_BYTES` when it is not set; an
    :class:`~sparkdl.errors.InvalidArgumentError` naming the setting when its value is not a
    size of at least :data:`MIN_RECORD_BYTES`.

    Example: ``max_record_bytes_setting(spark_setting(sc, MAX_RECORD_BYTES) or None)``"""
    meaning = ("the setting is the most bytes of a vector one shuffle record, task result or "
               "broadcast piece carries through a JVM")
    size = _positive_size(MAX_RECORD_BYTES, value,
                          f"{meaning}, and none carries nothing. Give a size such as 16m, or "
                          "leave it unset (32m).")
    if size is not None and size < MIN_RECORD_BYTES:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{MAX_RECORD_BYTES}={value!r}: {meaning}, and below 1 MiB a vector would cross "
            "in thousands of records per iteration (a bare number is bytes: 16m, not 16). "
            "Give a size of 1m or more, or leave it unset (32m).")
    return DEFAULT_RECORD_BYTES if size is None else size


def spark_setting(sc: Any, key: str, default: str = "") -> str:
    """``key``'s value in the running configuration of ``sc`` (a classic SparkContext), or
    ``default``: one py4j call, where ``sc.getConf()`` copies the whole configuration first
    (about 30 ms a call on local[2], several per fit).

    Example: ``spark_setting(sc, "spark.task.cpus", "1")``"""
    return str(sc._jsc.sc().conf().get(key, default))


SHARD_REPLICAS = "spark.sparkdl.shardReplicas"


def shard_replicas(setting: Callable[[str], str]) -> int:
    """How many executors hold each training shard (``spark.sparkdl.shardReplicas``, default 1:
    the executor that built it); an :class:`~sparkdl.errors.InvalidArgumentError` naming the
    value when it is not a whole number from 1 to 8.

    Example: ``shard_replicas(lambda k: spark_setting(sc, k))``"""
    from .errors import InvalidArgumentError

    value = (setting(SHARD_REPLICAS) or "1").strip()
    try:
        replicas = int(value)
    except ValueError:
        replicas = 0
    if not 1 <= replicas <= 8:
        raise InvalidArgumentError(
            f"{SHARD_REPLICAS}={value!r}: give how many executors should hold each training "
            "shard, a whole number from 1 (the default: the executor that built it) to 8; 2 "
            "lets a speculative or retried task start at once on a second holder")
    return replicas


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]`` and ``local[N,F]`` (one JVM that runs the
    tasks too), not ``local-cluster[...]``."""
    return master == "local" or master.startswith("local[")


def speculation_never_fires(setting: Callable[[str], str], master: str,
                            num_partitions: int) -> str | None:
    """Why Spark's speculation, turned on (``spark.speculation=true``), can never start a copy
    of a training task here (None: it can, or it is off). ``setting(key)``: the value, or "".

    Spark's rules (TaskSetManager, 3.5 and 4.x): a local master never speculates; a copy never
    starts on a host where the task already ran, and a ``local-cluster`` master's executors all
    share one host; a stage waits for ``floor(spark.speculation.quantile * tasks)`` finished
    tasks (at least one), so a quantile of 1 or more never gets there, nor a stage of one
    task, unless ``spark.speculation.task.duration.threshold`` is set.

    Example: ``speculation_never_fires(lambda k: conf.get(k, ""), "local[2]", 4)``"""
    if setting("spark.speculation").strip().lower() != "true":
        return None
    if is_local_master(master):
        return (f"the master is {master}: Spark never speculates in local mode (one JVM runs "
                "every task)")
    if master.startswith("local-cluster"):
        return (f"the master is {master}: its executors share one host, and Spark never starts "
                "a copy of a task on a host where it already ran")
    if setting("spark.speculation.task.duration.threshold").strip():
        return None
    if num_partitions <= 1:
        return ("the training data has one partition: Spark speculates in a stage only after "
                "some of its tasks finished (or with spark.speculation.task.duration.threshold)")
    quantile = setting("spark.speculation.quantile").strip()
    try:
        never = bool(quantile) and math.floor(float(quantile) * num_partitions) >= num_partitions
    except ValueError:
        return None
    if never:
        return (f"spark.speculation.quantile={quantile}: a stage of {num_partitions} tasks "
                "would have to finish all of them before a copy could start; a quantile below 1 "
                "leaves room for a copy")
    return None


def recommended_conf(master: str, given: set[str], starts_jvm: bool) -> dict[str, str]:
    """The recommended settings a session on ``master`` gets, less the keys in ``given`` (set
    by the user): :data:`CLUSTER_CONF` too where ``master`` is not a local one;
    :data:`LOCAL_JAVA_OPTIONS` only when the session ``starts_jvm`` on a local master.

    Example::

        recommended_conf("local[2]", set(), True)["spark.driver.extraJavaOptions"]
    """
    out = dict(RECOMMENDED_CONF)
    if not is_local_master(master):
        out.update(CLUSTER_CONF)
    if starts_jvm and is_local_master(master):
        out["spark.driver.extraJavaOptions"] = LOCAL_JAVA_OPTIONS
    return {k: v for k, v in out.items() if k not in given}


def _defaults_file_keys() -> set[str]:
    """The keys of the spark-defaults.conf that ``spark-submit`` would read for this session."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:        # spark-submit's SPARK_HOME: the pyspark package when pip-installed
        import pyspark

        home = os.environ.get("SPARK_HOME") or os.path.dirname(os.path.abspath(pyspark.__file__))
        conf_dir = os.path.join(home, "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as f:
            return {line.split(None, 1)[0] for line in f
                    if line.strip() and not line.lstrip().startswith("#")}
    except OSError:
        return set()


def spark_flag(sc: Any, key: str, default: bool) -> bool:
    """A boolean setting: the thread's local property (``sc.setLocalProperty``), else the
    running configuration (:func:`spark_setting`), else ``default``."""
    value = (sc.getLocalProperty(key) or spark_setting(sc, key) or "").strip().lower()
    return default if not value else value in ("true", "1", "yes")


def spark_number(sc: Any, key: str) -> float:
    """A numeric setting of the running configuration; 0 when unset or not a number."""
    value = spark_setting(sc, key, "0") or "0"
    try:
        return float(value)
    except ValueError:
        return 0.0


_PYTHON_KEYS = ("spark.pyspark.python", "spark.pyspark.driver.python")


def sets_pyspark_python(master: str, given: set[str], environ: Mapping[str, str],
                        starts_context: bool) -> bool:
    """Whether :func:`spark_session` points the executors at this interpreter
    (``PYSPARK_PYTHON=sys.executable``): only when this call starts the SparkContext
    (``starts_context``; its Python workers' interpreter is read then) on a ``local[...]`` or
    ``local-cluster[...]`` master (the executors run on this machine, from plain Python or
    under ``spark-submit``), and only where neither ``given`` (the keys the session's
    configuration sets) names ``spark.pyspark.python`` or ``spark.pyspark.driver.python`` nor
    ``environ`` has ``PYSPARK_PYTHON``. A cluster's executors may not have this path: a packed
    environment (``--archives env.tar.gz#env`` with ``spark.pyspark.python=./env/bin/python``)
    is theirs.

    Example: ``sets_pyspark_python("local[2]", set(), os.environ, True)``"""
    local = is_local_master(master) or master.startswith("local-cluster")
    return (starts_context and local and "PYSPARK_PYTHON" not in environ
            and not given.intersection(_PYTHON_KEYS))


def spark_session(app_name: str, master: str = "local[*]",
                  conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession with :data:`RECOMMENDED_CONF`.

    ``master`` is used only when nothing set one (under ``spark-submit --master ...`` the
    submitted master wins); a recommended setting is applied only where the job's own
    configuration (``--conf``, spark-defaults.conf) has none; ``conf`` entries always apply.
    A ``local[...]`` session this call starts gets :data:`LOCAL_JAVA_OPTIONS` as its driver's
    ``spark.driver.extraJavaOptions`` unless ``conf`` or the configuration sets that.
    A local session this call starts runs its executors with this interpreter, so they find
    torch (``PYSPARK_PYTHON``, unless it or ``spark.pyspark.python`` is set; never for a
    cluster master: :func:`sets_pyspark_python`).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if under_submit:
        # Started by spark-submit: its JVM already runs with the submitted settings.
        SparkContext._ensure_initialized()
        submitted = SparkConf()
    else:
        submitted = SparkConf(loadDefaults=False)
    builder = SparkSession.builder.appName(app_name)
    if not submitted.contains("spark.master"):
        builder = builder.master(master)
    starts_jvm = not under_submit and SparkContext._active_spark_context is None
    given = set(conf or {}) | {k for k, _ in submitted.getAll()} | _defaults_file_keys()
    effective = (conf or {}).get("spark.master") or submitted.get("spark.master", master)
    if sets_pyspark_python(effective, given, os.environ,
                           SparkContext._active_spark_context is None):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    for key, value in recommended_conf(submitted.get("spark.master", master), given,
                                       starts_jvm).items():
        builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
