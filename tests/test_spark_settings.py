"""The session sparkdl's ``spark_session`` builds: its recommended settings, the local JVM's
compiler options (issue 21: the cold JVM), and that nothing the user set is replaced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sparkdl.spark_settings import (CLUSTER_CONF, LOCAL_JAVA_OPTIONS, RECOMMENDED_CONF,
                                    _defaults_file_keys, is_local_master, recommended_conf)

JAVA = "spark.driver.extraJavaOptions"


def test_local_masters_get_the_quick_compiler_and_cluster_masters_do_not():
    for master in ("local", "local[2]", "local[*]", "local[4,3]"):
        assert is_local_master(master), master
        assert recommended_conf(master, set(), True)[JAVA] == LOCAL_JAVA_OPTIONS
        assert "spark.memory.fraction" not in recommended_conf(master, set(), True)
    for master in ("local-cluster[2,1,1024]", "spark://host:7077", "yarn", "k8s://h:443"):
        assert not is_local_master(master), master
        assert recommended_conf(master, set(), True) == {**RECOMMENDED_CONF, **CLUSTER_CONF}
        # executors in JVMs of their own: the block store's pool leaves room for the records
        assert recommended_conf(master, set(), True)["spark.memory.fraction"] == "0.3"
    # a JVM that runs already (spark-submit, an active context) cannot take it
    assert JAVA not in recommended_conf("local[2]", set(), False)


def test_what_the_user_set_is_never_replaced(tmp_path, monkeypatch):
    given = {JAVA, "spark.task.maxDirectResultSize"}
    out = recommended_conf("local[2]", given, True)
    assert not given & set(out)
    assert out["spark.python.unix.domain.socket.enabled"] == "true"
    # spark-defaults.conf counts as set (spark-submit reads it when pyspark starts the JVM)
    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\n\nspark.driver.extraJavaOptions  -Dsite=1\nspark.executor.memory 2g\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert _defaults_file_keys() == {JAVA, "spark.executor.memory"}


_JOB = """
import json, sys
from sparkdl.spark_settings import spark_session
conf = json.loads(sys.argv[1])
spark = spark_session("settings", "local[1]", conf)
bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print(json.dumps(list(bean.getInputArguments())))
spark.stop()
"""


def _jvm_arguments(conf: dict) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _JOB, json.dumps(conf)], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_local_session_starts_its_jvm_with_the_options_and_the_users_own():
    # the user's other settings (here the driver's memory) reach the same JVM
    arguments = _jvm_arguments({"spark.driver.memory": "700m"})
    assert LOCAL_JAVA_OPTIONS in arguments and "-Xmx700m" in arguments


def test_speculation_that_can_never_start_a_copy_is_named():
    """Spark's rules (3.5 and 4.x): no speculation on a local master, no copy on a host where
    the task ran (local-cluster: one host), a stage waits for floor(quantile * tasks) finished
    tasks (a quantile of 1 never gets there), a one-task stage only with the duration
    threshold."""
    from sparkdl.spark_settings import speculation_never_fires

    def why(master, partitions, **conf):
        settings = {"spark.speculation": "true", **{k.replace("_", "."): v
                                                    for k, v in conf.items()}}
        return speculation_never_fires(lambda key: settings.get(key, ""), master, partitions)

    assert speculation_never_fires(lambda key: "", "local[2]", 4) is None          # off
    assert speculation_never_fires(lambda key: {"spark.speculation": "false"}.get(key, ""),
                                   "local-cluster[2,1,1024]", 4) is None
    assert "local mode" in why("local[2]", 4)
    assert "local mode" in why("local[4,3]", 4)
    assert "share one host" in why("local-cluster[2,1,1024]", 4)
    for master in ("spark://a:7077", "yarn", "k8s://h:443"):
        assert why(master, 2) is None                              # Spark's defaults
        assert why(master, 2, spark_speculation_quantile="0.9") is None   # floor(1.8) = 1
        assert "quantile=1.0: a stage of 2 tasks" in why(
            master, 2, spark_speculation_quantile="1.0")
        assert why(master, 2, spark_speculation_quantile="1.0",
                   spark_speculation_task_duration_threshold="2s") is None
        assert "one partition" in why(master, 1)
        assert why(master, 1, spark_speculation_task_duration_threshold="2s") is None
