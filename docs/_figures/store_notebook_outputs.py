"""Execute the notebooks top to bottom from a clean kernel and store them with their outputs.

The site renders the stored outputs (docs/_hooks/site_hooks.py); tests/test_docs_site.py checks
that every code cell that prints or draws carries its output and that no output names a path of
the machine that ran it. Run from the repository root, with the Fashion-MNIST files installed
(``apt-get install dataset-fashion-mnist``)::

    python docs/_figures/store_notebook_outputs.py            # both notebooks
    python docs/_figures/store_notebook_outputs.py quickstart_engine.ipynb
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

import nbclient
import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = ["quickstart_dataframe.ipynb", "quickstart_engine.ipynb"]
# Absolute paths of the machine that ran the notebook: temporary folders, the checkout, a venv.
_MACHINE_PATH = re.compile(r"(?:/tmp|/var/folders|/home|/Users|/work|/root|/usr/lib|/opt)/[^\s'\"]*")


def scrub(text: str) -> str:
    """The text with the machine's absolute paths shortened to ``.../<name>``."""
    return _MACHINE_PATH.sub(lambda m: ".../" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def _scrub_output(output: dict) -> dict:
    if "text" in output:
        output["text"] = scrub(output["text"])
    for key, value in output.get("data", {}).items():
        if key.startswith("text/") and isinstance(value, str):
            output["data"][key] = scrub(value)
    return output


def store(name: str) -> None:
    path = os.path.join(ROOT, "notebooks", name)
    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    with tempfile.TemporaryDirectory() as workdir:
        nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": workdir}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            # Warnings on stderr name the library files that raised them: not for readers.
            cell.outputs = [_scrub_output(o) for o in cell.outputs
                            if not (o.output_type == "stream" and o.name == "stderr")]
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for notebook in sys.argv[1:] or NOTEBOOKS:
        store(notebook)
        print("stored", notebook)
