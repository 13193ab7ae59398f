"""The Spark settings sparkdl relies on, and a session builder that applies them.

``RECOMMENDED_CONF`` is what every sparkdl job should run with (README, "Spark settings"):

- ``spark.python.unix.domain.socket.enabled=true``: the JVM talks to Python workers over a
  Unix socket; over loopback TCP each task waited ~40 ms for its first input bytes (Nagle /
  delayed ACK), once per task and so several times per iteration.
- ``spark.task.maxDirectResultSize=64m``: a task result above Spark's 1 MiB default is put in
  the executor's block manager and fetched from there by the driver, an extra store and read of
  every summed gradient block; up to 64 MiB (under the 128 MiB RPC message limit) it travels in
  the task's status message. Measured with ``bench/bytes_path.py`` on local[2]: the 76 MiB
  gradient's reducers-to-driver hop fell from 328 to 260 ms (bench/RESULTS.md).
- ``spark.ui.showConsoleProgress=false``: Spark's stage bar would fight sparkdl's own progress
  bar for the terminal line.

Example::

    from sparkdl.spark_settings import spark_session
    spark = spark_session("my job")        # local[*] under plain python, spark-submit's master
                                           # (and its --conf values) under spark-submit
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

__all__ = ["RECOMMENDED_CONF", "spark_session"]

RECOMMENDED_CONF: dict[str, str] = {
    "spark.python.unix.domain.socket.enabled": "true",
    "spark.task.maxDirectResultSize": "64m",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(app_name: str, master: str = "local[*]",
                  conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession with :data:`RECOMMENDED_CONF`.

    ``master`` is used only when nothing set one (under ``spark-submit --master ...`` the
    submitted master wins); a recommended setting is applied only where the job's own
    configuration (``--conf``, spark-defaults.conf) has none; ``conf`` entries always apply.
    ``PYSPARK_PYTHON`` defaults to this interpreter, so executors find torch.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Started by spark-submit: its JVM already runs with the submitted settings.
        SparkContext._ensure_initialized()
        submitted = SparkConf()
    else:
        submitted = SparkConf(loadDefaults=False)
    builder = SparkSession.builder.appName(app_name)
    if not submitted.contains("spark.master"):
        builder = builder.master(master)
    for key, value in RECOMMENDED_CONF.items():
        if not submitted.contains(key):
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
