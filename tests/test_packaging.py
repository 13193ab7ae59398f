"""The distribution as users get it: the wheel built from this tree, installed into a fresh venv.

The wheel is built offline with this environment's setuptools (no build isolation) and installed
without its dependencies into a venv created without pip; a ``.pth`` file gives that venv this
environment's site-packages for pyspark, torch and the rest. A plain path line in a ``.pth`` is
added to ``sys.path`` but the ``.pth`` files inside that directory are not processed, so an
editable install of sparkdl there stays inactive: only the wheel provides ``sparkdl``.
"""

from __future__ import annotations

import email.parser
import glob
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sparkdl

ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = ROOT / "tests"
# What building the wheel reads: the metadata, the readme and license it names, the package.
BUILD_INPUTS = ["pyproject.toml", "setup.cfg", "MANIFEST.in", "README.md", "LICENSE"]

# Runs in the fresh venv: sparkdl from the wheel on the driver and the executors, a small
# DistriOptimizer fit on local[2] next to single-process torch on the same union batches.
FIT_SCRIPT = """
import copy, json
import torch
from pyspark.sql import SparkSession
import sparkdl
from sparkdl import DistriOptimizer
from sparkdl.data.batch_plan import BatchPlan
from sparkdl.triggers import MaxIteration
from models import SmallNet, classification_data, make_rdd, max_abs_diff, reference_train

spark = (SparkSession.builder.master("local[2]").appName("sparkdl-wheel")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
sc = spark.sparkContext
sc.setLogLevel("ERROR")
executor_files = sc.parallelize(range(2), 2).map(
    lambda _: __import__("sparkdl").__file__).distinct().collect()
sizes, batch_size, iterations, seed = [40, 24], 16, 3, 3
x, y = classification_data(sum(sizes), seed=seed)
torch.manual_seed(seed)
initial = SmallNet()
net = copy.deepcopy(initial)
make_optimizer = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
criterion = torch.nn.CrossEntropyLoss()
trained = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), sizes), criterion,
                          make_optimizer(net), batch_size=batch_size,
                          end_trigger=MaxIteration(iterations), seed=seed).optimize()
reference = reference_train(initial, x, y, criterion, make_optimizer,
                            BatchPlan(sizes, batch_size, seed), iterations)
spark.stop()
print("RESULT", json.dumps({"driver": sparkdl.__file__, "executors": executor_files,
                            "moved": max_abs_diff(trained, initial),
                            "difference": max_abs_diff(trained, reference)}))
"""


def _venv_site_packages(venv: Path) -> Path:
    (found,) = glob.glob(str(venv / "lib" / "python*" / "site-packages"))
    return Path(found)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the tree's build inputs (the build writes its egg-info and
    build/ beside the sources, never into the tree)."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "sparkdl", source / "sparkdl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "-w", str(out), str(source)],
                   check=True, capture_output=True, text=True)
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory, wheel) -> Path:
    """A venv with only the wheel installed; this environment's site-packages through a .pth,
    written after the install so that pip sees an empty environment."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True)
    (_venv_site_packages(venv) / "test_environment.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    return venv


def _fresh_env(venv: Path, pythonpath: Path | None = None) -> dict[str, str]:
    """The environment of a fresh-venv process: its interpreter on the executors too, and on
    PYTHONPATH only ``pythonpath`` (never the tree)."""
    env = {**os.environ, "PYSPARK_PYTHON": str(venv / "bin" / "python")}
    env.pop("PYTHONPATH", None)
    return {**env, "PYTHONPATH": str(pythonpath)} if pythonpath else env


def test_the_installed_wheel_trains_like_single_process_torch(fresh_venv, tmp_path):
    done = subprocess.run([str(fresh_venv / "bin" / "python"), "-c", FIT_SCRIPT],
                          cwd=tmp_path, env=_fresh_env(fresh_venv, TESTS_DIR),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    installed = str(_venv_site_packages(fresh_venv) / "sparkdl" / "__init__.py")
    assert result["driver"] == installed
    assert result["executors"] == [installed]
    assert result["moved"] > 1e-2
    assert result["difference"] <= 1e-5


def test_the_wheel_metadata_names_sparkdl_torch_under_apache_2(wheel, fresh_venv):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"sparkdl_torch-{sparkdl.__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(
            archive.read(f"{info}/METADATA").decode("utf-8"))
        license_text = archive.read(f"{info}/licenses/LICENSE")
    assert wheel.name == f"sparkdl_torch-{sparkdl.__version__}-py3-none-any.whl"
    assert metadata["Name"] == "sparkdl-torch" == sparkdl.__distribution__
    assert metadata["Version"] == sparkdl.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Requires-Python"] == ">=3.10"
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert not [c for c in metadata.get_all("Classifier") if c.startswith("License ::")]
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert license_text.split()[:4] == [b"Apache", b"License", b"Version", b"2.0,"]
    assert "sparkdl/py.typed" in names
    # The import-time check looks for other projects' entries: none may be a name of ours.
    top_level = {n.split("/")[1].split(".")[0] for n in names if n.startswith("sparkdl/")}
    assert not top_level & set(sparkdl._FOREIGN_PROJECTS)

    # The installed distribution, as importlib.metadata sees it in the fresh venv.
    done = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c",
         "import importlib.metadata as m, json; d = m.distribution('sparkdl-torch'); "
         "print(json.dumps([d.version, d.metadata['License-Expression'], "
         "str(d.locate_file('sparkdl/py.typed'))]))"],
        capture_output=True, text=True, check=True, env=_fresh_env(fresh_venv),
        cwd=fresh_venv)   # not the tree: its editable install's egg-info would be found first
    version, expression, typed = json.loads(done.stdout)
    assert [version, expression] == [sparkdl.__version__, "Apache-2.0"]
    assert Path(typed) == _venv_site_packages(fresh_venv) / "sparkdl" / "py.typed"
    assert Path(typed).is_file()


def _import_from(site_dir: Path, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sparkdl; print(sparkdl.__file__)"],
                          cwd=site_dir, env=_fresh_env(venv, site_dir),
                          capture_output=True, text=True)


@pytest.mark.parametrize("foreign, project", [
    (["horovod/__init__.py", "xgboost/__init__.py"],
     "Databricks' runtime module sparkdl (HorovodRunner, XGBoost)"),
    (["graph/__init__.py", "transformers/__init__.py", "udf/keras_image_model.py"],
     "the 2018 PyPI project sparkdl (Deep Learning Pipelines)"),
])
def test_a_package_directory_mixed_with_another_project_refuses_to_import(
        fresh_venv, tmp_path, foreign, project):
    package = tmp_path / "sparkdl"
    shutil.copytree(_venv_site_packages(fresh_venv) / "sparkdl", package)
    for name in foreign:
        (package / name).parent.mkdir(exist_ok=True)
        (package / name).write_text("")
    done = _import_from(tmp_path, fresh_venv)
    assert done.returncode == 1
    entries = ", ".join(sorted(name.split("/")[0] for name in foreign))
    assert (f"ImportError: The package directory {package} holds sparkdl-torch's files and "
            f"another project's: {entries}, which look like {project}."
            ) in done.stderr, done.stderr
    assert "pip uninstall -y sparkdl sparkdl-torch && pip install sparkdl-torch" in done.stderr
    assert "notebook-scoped or virtual environment" in done.stderr


def test_a_package_directory_with_only_its_own_files_imports(fresh_venv, tmp_path):
    """The installed files, a file of one's own, hidden files and a removed package's
    bytecode-only leftover."""
    package = tmp_path / "sparkdl"
    shutil.copytree(_venv_site_packages(fresh_venv) / "sparkdl", package)
    (package / "removed_package" / "__pycache__").mkdir(parents=True)
    (package / "removed_package" / "__pycache__" / "module.cpython-311.pyc").write_bytes(b"")
    (package / ".DS_Store").write_bytes(b"")
    (package / "notes.py").write_text("")
    done = _import_from(tmp_path, fresh_venv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(package / "__init__.py")
