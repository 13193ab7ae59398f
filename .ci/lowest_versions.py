"""The declared floors of pyproject.toml, for .ci/run's lowest-floors block.

    python3 .ci/lowest_versions.py               # the floors as pins, one per line: pyspark==3.4
    python3 .ci/lowest_versions.py --python      # the lowest Python (requires-python)
    python3 .ci/lowest_versions.py --interpreter # a path to that Python (PATH, then pyenv's)
    python3 .ci/lowest_versions.py --check PY    # PY (a venv's python) has exactly those versions
    python3 .ci/lowest_versions.py --requirements [EXTRA ...]   # the dependencies as declared
                                                 # (and the extras'), one per line

Runs on Python 3.11+ (tomllib): .ci/run calls it with the machine's python3 or the newest venv's.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
floors = dict(re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", r).groups()
              for r in project["dependencies"])
lowest_python = re.fullmatch(r">=\s*([0-9.]+)", project["requires-python"]).group(1)


def release(version):
    """'2' and '2.0.0' alike: the numeric release, trailing zeros dropped; a pre-release or dev
    build (1.24.0rc1) is not its release (a local suffix, 2.1.0+cpu, is)."""
    found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)*)(\+.*)?", version)
    if not found:
        return [-1]
    parts = [int(p) for p in found.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return parts


def interpreter(version):
    """A working ``python<version>``: on PATH, else any pyenv install of that version (pyenv's
    shim on PATH fails unless that version is selected); exits naming the version if none."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}")] + sorted(
        glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
    for path in filter(None, candidates):
        if subprocess.run([path, "-c", ""], capture_output=True).returncode == 0:
            return path
    sys.exit(f"no working python{version} on this machine (PATH, {root}/versions): the lowest "
             "declared Python cannot be tested")


if sys.argv[1:] == ["--python"]:
    print(lowest_python)
elif sys.argv[1:] == ["--interpreter"]:
    print(interpreter(lowest_python))
elif sys.argv[1:2] == ["--requirements"]:
    extras = project.get("optional-dependencies", {})
    print("\n".join(project["dependencies"] + [r for e in sys.argv[2:] for r in extras[e]]))
elif sys.argv[1:2] == ["--check"]:
    probe = ("import importlib.metadata as m, json, platform; print(json.dumps("
             f"{{n: m.version(n) for n in {sorted(floors)!r}}} | "
             "{'python': platform.python_version()}))")
    installed = json.loads(subprocess.check_output([sys.argv[2], "-c", probe], text=True))
    wanted = dict(floors, python=lowest_python)
    wrong = {n: (installed[n], v) for n, v in wanted.items()
             if release(installed[n])[:len(release(v))] != release(v)
             or (n != "python" and release(installed[n]) != release(v))}
    if wrong:
        sys.exit(f"not the declared floors (installed, declared): {wrong}")
    print("at the declared floors:", installed)
else:
    print("\n".join(f"{name}=={floor}" for name, floor in floors.items()))
