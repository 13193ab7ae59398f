"""Shared fixtures: one local[2] SparkSession for the whole run (a session costs 10-20 s)."""

from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Executors run this interpreter (the test venv) and can import the helper modules in tests/,
# as a user's executors import their code shipped with --py-files.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Loopback only: the tests never listen on another interface.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p)
# Every JVM the tests start (the session's, local-cluster executors, standalone daemons, the
# jobs run as subprocesses, Connect servers) compiles with C1 only: short-lived JVMs on a 2-core
# machine otherwise spend their cores on C2 compiling while the Python workers wait
# (sparkdl.spark_settings.LOCAL_JAVA_OPTIONS; bench/jvm_options.py). It changes no result.
if "TieredStopAtLevel" not in os.environ.get("JDK_JAVA_OPTIONS", ""):
    from sparkdl.spark_settings import LOCAL_JAVA_OPTIONS

    os.environ["JDK_JAVA_OPTIONS"] = " ".join(
        p for p in (os.environ.get("JDK_JAVA_OPTIONS", ""), LOCAL_JAVA_OPTIONS) if p)


FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="session")
def fashion_mnist() -> str:
    """Fashion-MNIST's directory (the Debian package the README's test command installs). A test
    that needs it fails without it, never skips: CI must not pass on tests it did not run."""
    if not os.path.isdir(FASHION_MNIST):
        pytest.fail(f"Fashion-MNIST is not at {FASHION_MNIST}: apt-get install "
                    "dataset-fashion-mnist (the README's test command does)")
    return FASHION_MNIST

def spark_builder(master: str):
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(master)
            .appName("sparkdl-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.python.unix.domain.socket.enabled", "true")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "2"))


@pytest.fixture(scope="session")
def spark():
    session = spark_builder("local[2]").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext


# Compares two interpreters' pyspark versions: run by .ci/run's pyspark 3.5 block, which names
# the other interpreter (tests/test_same_weights_across_spark_versions.py).
collect_ignore = ([] if os.environ.get("SPARKDL_OTHER_PYTHON")
                  else ["test_same_weights_across_spark_versions.py"])
