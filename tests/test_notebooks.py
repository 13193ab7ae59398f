"""The notebooks run top to bottom from a clean kernel (nbclient), as a user would run them,
and draw their plots: training curves, a confusion matrix, and the progress bar. They are stored
with their outputs (the site shows them; tests/test_docs_site.py checks what is stored): a fresh
run gives every cell the same kinds of output as stored, so the stored ones are not stale."""

from __future__ import annotations

import os

import nbclient
import nbformat
import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ["quickstart_dataframe.ipynb", "quickstart_engine.ipynb"]


def read(name):
    return nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)


def tagged(nb, tag):
    cells = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"one cell tagged {tag!r} expected"
    return cells[0]


def output_kinds(nb) -> list[list[tuple]]:
    """Per code cell, the kinds of its outputs: ("stream", name) or (output type, MIME types).
    A set: how printed text splits into stream outputs depends on timing. The warnings a run
    prints on stderr are not stored and not compared."""
    return [sorted({("stream", o.name, ()) if o.output_type == "stream" else
                    (o.output_type, "", tuple(sorted(o.get("data", {}))))
                    for o in c.outputs if not (o.output_type == "stream" and o.name == "stderr")})
            for c in nb.cells if c.cell_type == "code"]


@pytest.mark.usefixtures("fashion_mnist")
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_plots(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = read(name)
    stored = output_kinds(nb)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert errors == []
    assert output_kinds(nb) == stored, \
        "stored outputs differ from a fresh run: python docs/_figures/store_notebook_outputs.py"
    tags = ("curves", "confusion-matrix") + (("mlflow",) if name == "quickstart_dataframe.ipynb"
                                             else ())
    for tag in tags:
        images = [o for o in tagged(nb, tag).outputs if "image/png" in o.get("data", {})]
        assert images, f"cell {tag!r} drew no plot"
    bars = [o for o in tagged(nb, "fit").outputs
            if "<progress" in o.get("data", {}).get("text/html", "")]
    assert bars, "no progress bar in the fit cell"
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    accuracy = float(text.split("test accuracy: ")[1].split()[0])
    assert accuracy >= 0.8
