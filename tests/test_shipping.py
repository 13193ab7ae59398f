"""Shipping sparkdl to executors whose Python does not have it, with ``spark-submit`` as the
deployment guide (docs/guide/deployment.md) writes it, on a standalone master and worker on
127.0.0.1.

The executors run a bare virtual environment whose one ``.pth`` line adds this venv's
site-packages (torch, numpy, pyspark): a plain path in a ``.pth`` is added to ``sys.path`` but
the ``.pth`` files inside it (an editable install's finder) are not processed, so ``import
sparkdl`` fails there (checked first). The driver has sparkdl (this tree), as the guide asks.
On that cluster the engine example trains with ``--py-files sparkdl.zip``, then with
``--archives`` of an environment packed with venv-pack, to the same test accuracy; and without
either, the fit ends with the error that says how to ship sparkdl.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import time

import pytest

from sparkdl.errors import ExecutorImportError, SparkdlError
from sparkdl.runners.executor_imports import executor_import_error, missing_sparkdl_reason
from test_standalone_cluster import StandaloneCluster, processes_under

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "lenet_fashion_mnist_engine.py")
# Small enough for seconds of training: 16 iterations of 128 on 2 partitions, then the test set.
EXAMPLE_ARGS = ["--train-samples", "2000", "--epochs", "1", "--batch-size", "128",
                "--partitions", "2", "--no-progress"]



def base_site_packages() -> list[str]:
    """This interpreter's site-packages directories (torch, numpy, pyspark live there)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def bare_venv(path, pth_lines: list[str]) -> str:
    """A virtual environment without pip whose site-packages holds one ``.pth`` listing
    ``pth_lines``; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if pth_lines:
        (site / "base.pth").write_text("".join(f"{line}\n" for line in pth_lines))
    return str(path / "bin" / "python")


@pytest.fixture(scope="module")
def shipping(tmp_path_factory):
    """The bare executors' Python, the working directory, and a standalone master with one
    2-core worker whose executors run that Python unless a job says otherwise."""
    tmp = tmp_path_factory.mktemp("shipping")
    python = bare_venv(tmp / "bare", base_site_packages())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([python, "-c", "import torch, pyspark; import sparkdl"],
                           capture_output=True, text=True, cwd=tmp, env=env)
    assert probe.returncode != 0 and "No module named 'sparkdl'" in probe.stderr, probe.stderr
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=python, SPARK_NO_DAEMONIZE="1")
    cluster = StandaloneCluster(tmp, workers=1, env=env, cores=2)
    try:
        yield python, tmp, cluster
    finally:
        cluster.stop()
    time.sleep(1)
    assert processes_under(str(tmp)) == []


def submit(cluster, cwd, executor_python: str, *options: str) -> subprocess.CompletedProcess:
    """``spark-submit`` of the engine example from ``cwd`` (not the repository): the driver runs
    this interpreter with this tree's sparkdl, the executors ``executor_python``."""
    spark_submit = os.path.join(os.path.dirname(cluster.spark_class), "spark-submit")
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON",
                                                             "PYSPARK_DRIVER_PYTHON")}
    env.update(PYTHONPATH=ROOT, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run(
        [spark_submit, "--master", cluster.url, "--executor-memory", "1g",
         "--total-executor-cores", "2",
         "--conf", f"spark.pyspark.python={executor_python}",
         "--conf", f"spark.pyspark.driver.python={sys.executable}",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
         *options, EXAMPLE, *EXAMPLE_ARGS],
        capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def accuracy(proc) -> str:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return re.search(r"test accuracy: ([0-9.]+)", proc.stdout).group(1)


@pytest.mark.cluster
def test_py_files_zip_and_packed_environment_train_the_example(shipping):
    """(a) ``--py-files sparkdl.zip``, the zip made with ``python -m zipfile -c`` from the
    package directory; (b) ``--archives sparkdl-env.tar.gz#environment`` of a venv holding
    sparkdl installed from this tree (not editable), packed with venv-pack, its
    ``./environment/bin/python`` the executors' Python. Both train the example to the same
    test accuracy (the same run: its seed, partitions and batch plan), which is above chance
    by far."""
    python, tmp, cluster = shipping
    zipped = tmp / "sparkdl.zip"
    subprocess.run([sys.executable, "-m", "zipfile", "-c", str(zipped),
                    os.path.join(ROOT, "sparkdl")], check=True)
    from_zip = submit(cluster, tmp, python, "--py-files", str(zipped))
    # The packed environment holds sparkdl only, not torch and pyspark (hundreds of MB to pack
    # and unpack): the executors find those on spark.executorEnv.PYTHONPATH, this venv's
    # site-packages (venv-pack refuses a .pth naming a directory outside the environment). A
    # user's environment carries torch; what is under test is the same: the archive unpacked
    # in each executor's directory, its interpreter running the tasks, sparkdl imported from
    # its site-packages.
    env_dir = tmp / "packed"
    bare_venv(env_dir, [])
    site = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(site), ROOT], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    packed = tmp / "sparkdl-env.tar.gz"
    subprocess.run([sys.executable, "-m", "venv_pack", "-p", str(env_dir), "-o", str(packed)],
                   check=True, capture_output=True)
    from_archive = submit(
        cluster, tmp, "./environment/bin/python", "--archives", f"{packed}#environment",
        "--conf", "spark.executorEnv.PYTHONPATH=" + os.pathsep.join(base_site_packages()))
    assert accuracy(from_zip) == accuracy(from_archive)
    assert float(accuracy(from_zip)) >= 0.5      # 0.5622 with these arguments; chance: 0.1
    # the archive's interpreter ran the tasks: its unpacked copy is in the executor's directory
    executors = [tmp / "worker0" / app / ex for app in os.listdir(tmp / "worker0")
                 for ex in os.listdir(tmp / "worker0" / app)]
    assert sum((ex / "environment" / "bin" / "python").exists() for ex in executors) == 1


@pytest.mark.cluster
def test_executors_without_sparkdl_end_the_fit_with_how_to_ship_it(shipping):
    """No --py-files, no archive: the first job's tasks cannot unpickle sparkdl's functions,
    and the fit ends with ExecutorImportError saying how to ship it (spark-submit's Python
    driver writes its traceback to stdout)."""
    python, tmp, cluster = shipping
    proc = submit(cluster, tmp, python, "--conf", "spark.task.maxFailures=2")
    assert proc.returncode != 0
    last = proc.stdout.rsplit("Traceback (most recent call last):", 1)[-1]
    assert ("sparkdl.errors.ExecutorImportError: building the training shards: the executors' "
            "Python cannot import sparkdl-torch (ModuleNotFoundError: No module named "
            "'sparkdl')") in last, proc.stdout[-4000:]
    assert "--py-files sparkdl.zip" in last and "--archives env.tar.gz#env" in last
    assert "docs/guide/deployment.md" in last


@pytest.mark.parametrize("text, line", [
    # what a task's Python says when it lacks sparkdl, inside Spark's job error
    ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
     '  File "serializers.py", line 483, in loads\n'
     "ModuleNotFoundError: No module named 'sparkdl'\n SQLSTATE: 38000",
     "ModuleNotFoundError: No module named 'sparkdl'"),
    # another project's sparkdl (a runtime's own module) found first
    ("Lost task 0.0: ModuleNotFoundError: No module named 'sparkdl.executor'",
     "ModuleNotFoundError: No module named 'sparkdl.executor'"),
    ("ImportError: cannot import name 'tasks' from 'sparkdl.executor' (unknown location)",
     "ImportError: cannot import name 'tasks' from 'sparkdl.executor' (unknown location)"),
    # other failures are not this one
    ("ModuleNotFoundError: No module named 'torchvision'", None),
    ("ModuleNotFoundError: No module named 'sparkdl_helpers'", None),
    ("org.apache.spark.SparkException: Checkpoint block rdd_4_1 not found", None),
])
def test_missing_sparkdl_reason_reads_the_import_failure(text, line):
    assert missing_sparkdl_reason(text) == line
    assert missing_sparkdl_reason(RuntimeError(text)) == line


def test_executor_import_error_says_how_to_ship_sparkdl():
    error = executor_import_error("iteration 3", "ModuleNotFoundError: No module named 'sparkdl'")
    assert isinstance(error, SparkdlError) and isinstance(error, ImportError)
    assert isinstance(error, ExecutorImportError)
    text = str(error)
    assert text.startswith("iteration 3: the executors' Python cannot import sparkdl-torch "
                           "(ModuleNotFoundError: No module named 'sparkdl').")
    for way in ("pip install sparkdl-torch", "--py-files sparkdl.zip",
                "--archives env.tar.gz#env", "spark.pyspark.python=./env/bin/python",
                "docs/guide/deployment.md"):
        assert way in text
