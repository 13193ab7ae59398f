"""The documentation as users get it: text written for them, a site that builds, and notebooks
stored with the outputs the site shows.

* No page, README, notebook or site setting speaks of how the project was made (issue numbers,
  work sessions, "my run"): ``WORKSHOP_WORDS`` below, checked on positive and negative
  examples first, so a pattern that matches Spark's own sessions fails here.
* ``mkdocs build --strict`` succeeds (a broken link, anchor or reference fails it), the
  notebooks become pages with their plots, and every figure a page shows exists in the site.
* The notebooks carry their outputs: every cell that prints or draws has them, the plots are
  PNGs, and no output names a path of the machine that ran it or an error.
  tests/test_notebooks.py executes them afresh and compares the kinds of outputs.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import subprocess
import sys
from html import unescape

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))

# What a user must not read: the project's own history. Each entry: (pattern, what it catches).
WORKSHOP_WORDS = [
    (r"\bissues?[ \t-]*#?\d+", "an issue number (issue 52, issue-52 in an anchor)"),
    (r"(?<![\w&/#])#\d+\b", "an issue reference (#52)"),
    (r"\bthis session\b", "a work session"),
    (r"\b(?:last|previous|next|earlier|later) session\b", "a work session"),
    (r"\bsessions? of this project\b|\bthis project's sessions?\b", "a work session"),
    (r"\bmy run\b", "one person's run"),
    (r"\bwe measured last\b", "a measurement's history"),
    (r"\bthis round\b", "a round of work"),
    (r"\bthis (?:project's )?(?:\d-core )?machine\b", "the machine the project was built on"),
    (r"\blent a machine\b|\bno GPU was available\b", "the project's hardware"),
    (r"\bused to be\b", "history"),
]
_WORKSHOP = [(re.compile(pattern, re.IGNORECASE), what) for pattern, what in WORKSHOP_WORDS]


def workshop_words(text: str) -> list[str]:
    """The workshop words in ``text``: 'what: matched text' for each."""
    return [f"{what}: {m.group(0)!r}" for rx, what in _WORKSHOP for m in rx.finditer(text)]


@pytest.mark.parametrize("text", [
    "fixed in issue 52", "see Issue #6", "[results](bench/RESULTS.md#local-rounds-issue-52)",
    "as in #52", "measured this session", "until the last session", "no session of this project",
    "in my run the accuracy was 0.898", "the figure we measured last", "this round adds",
    "on this machine", "this project's 2-core machine", "no session has been lent a machine",
    "no GPU was available", "it used to be slower",
])
def test_workshop_words_are_found(text):
    assert workshop_words(text), text


@pytest.mark.parametrize("text", [
    "a SparkSession with the recommended settings", "a Spark session", "classic sessions",
    "a Connect session on them gets an error", "`spark_session(...)` starts one",
    "the job's sum files stay until the session stops", "each round is one job",
    "one exchange per round", "a round's delta", "round trips", "the rounds' H",
    "[the engine](#the-engine)", "color #3949ab", "&#8212;", "epoch 1/3 94/94",
    "a 2-core machine", "the machine has 2 cores", "a GPU per task", "issues with the network",
    "python bench/compare_runners.py --rounds 2",
])
def test_legitimate_words_pass(text):
    assert workshop_words(text) == [], text


def user_texts() -> list[tuple[str, str]]:
    """(where, text) of README.md, docs/**/*.md, mkdocs.yml and the notebooks' markdown cells."""
    paths = ["README.md", "mkdocs.yml"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                     recursive=True))
    texts = []
    for path in paths:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            texts.append((path, f.read()))
    for path in NOTEBOOKS:
        with open(path, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
        for n, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                texts.append((f"{os.path.relpath(path, ROOT)} cell {n}", "".join(cell["source"])))
    return texts


def test_no_workshop_words_for_users():
    found = [f"{where}: {word}" for where, text in user_texts()
             for word in workshop_words(text)]
    assert found == []


# --- the site ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


def page(site, name: str) -> str:
    with open(os.path.join(site, name, "index.html"), encoding="utf-8") as f:
        return f.read()


def page_text(site, name: str) -> str:
    """What the page reads as, its tags dropped (code blocks are split into highlighted spans)."""
    return unescape(re.sub(r"<[^>]+>", "", page(site, name)))


def images_of(site, name: str) -> list[str]:
    """The files the page's <img> tags show, as paths in the site (each must exist)."""
    folder = os.path.join(site, name)
    found = []
    for src in re.findall(r'<img[^>]*\ssrc="([^"]+)"', page(site, name)):
        path = os.path.normpath(os.path.join(folder, src))
        assert os.path.isfile(path), f"{name} shows {src}, missing from the site"
        found.append(os.path.relpath(path, site).replace(os.sep, "/"))
    return found


@pytest.mark.parametrize("name, figures", [
    ("", ["images/architecture.svg", "images/iteration-timeline.svg"]),
    ("architecture", ["images/architecture.svg"]),
    ("scaling", ["images/iteration-timeline.svg"]),
    ("guide/local-rounds", ["images/round-timeline.svg"]),
    ("getting-started", ["images/progress-bar.svg", "images/training-curves.svg"]),
])
def test_pages_show_their_figures(site, name, figures):
    assert set(figures) <= set(images_of(site, name))


def test_figures_are_svg_drawings(site):
    for name in ("architecture", "iteration-timeline", "round-timeline", "progress-bar",
                 "training-curves"):
        with open(os.path.join(site, "images", f"{name}.svg"), encoding="utf-8") as f:
            svg = f.read()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "<path" in svg, name
        assert not re.search(r"(?:/tmp|/home|/work|/Users)/", svg), name


@pytest.mark.parametrize("notebook", [os.path.basename(p) for p in NOTEBOOKS])
def test_notebooks_are_pages_with_their_plots(site, notebook):
    stem = notebook[: -len(".ipynb")]
    html = page(site, f"notebooks/{stem}")
    with open(os.path.join(ROOT, "notebooks", notebook), encoding="utf-8") as f:
        nb = json.load(f)
    pngs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]
            if "image/png" in o.get("data", {})]
    shown = [p for p in images_of(site, f"notebooks/{stem}") if p.endswith(".png")]
    assert len(shown) == len(pngs) >= 2
    assert "<progress" in html                              # the fit's progress bar, as stored
    text = page_text(site, f"notebooks/{stem}")
    for cell in nb["cells"]:                                # every cell's code, in order
        if cell["cell_type"] == "code":
            first = "".join(cell["source"]).strip().splitlines()[0]
            assert first in text, first
    # the notebook file itself is served beside its page, for download
    assert os.path.isfile(os.path.join(site, "notebooks", notebook))


def test_benchmarks_page_links_the_full_log(site):
    html = page(site, "benchmarks")
    assert ('href="https://github.com/sparkdl-torch/sparkdl-torch/blob/main/bench/RESULTS.md"'
            in html)
    assert page_text(site, "benchmarks").count("python bench/") >= 10   # figures with commands


# --- the notebooks' stored outputs ------------------------------------------------------------

MACHINE_PATH = re.compile(r"(?:/tmp|/var/folders|/home|/Users|/work|/root|\.venv)/")


def shows_something(source: str) -> bool:
    """Whether a cell, run, prints or draws: it calls print/display/plt.show, or ends in an
    expression other than a call that returns nothing (``spark.stop()``)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            if name in {"print", "display", "show", "printSchema"}:
                return True
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return False
    call = last.value
    return not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "stop")


def code_cells(path):
    with open(path, encoding="utf-8") as f:
        return [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]


def test_shows_something():
    assert shows_something("x = 1\nx")
    assert shows_something("plt.plot([1])\nplt.show()")
    assert shows_something("df.printSchema()")
    assert shows_something("for i in range(2):\n    print(i)")
    assert not shows_something("import torch\nx = 1")
    assert not shows_something("spark.stop()")
    assert not shows_something("def f():\n    return 1")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebooks_are_stored_with_their_outputs(path):
    cells = code_cells(path)
    counts = [c["execution_count"] for c in cells if c["execution_count"] is not None]
    assert counts == list(range(1, len(cells) + 1)), "run top to bottom from a fresh kernel"
    for cell in cells:
        source = "".join(cell["source"])
        kinds = {o["output_type"] for o in cell["outputs"]}
        assert "error" not in kinds, source[:80]
        if shows_something(source):
            assert cell["outputs"], f"no stored output for: {source[:80]}"
        for output in cell["outputs"]:
            text = "".join(output.get("text", "")) + "".join(
                "".join(v) for k, v in output.get("data", {}).items() if k.startswith("text/"))
            assert not MACHINE_PATH.search(text), f"a machine path in the output of {source[:60]}"
            assert workshop_words(text) == [], source[:60]
            assert not (output["output_type"] == "stream" and output["name"] == "stderr"), \
                f"warnings stored for: {source[:60]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebooks_store_their_plots(path):
    cells = code_cells(path)
    tags = {t: c for c in cells for t in c.get("metadata", {}).get("tags", [])}
    expected = ["curves", "confusion-matrix"] + (["mlflow"] if "dataframe" in path else [])
    for tag in expected:
        assert any("image/png" in o.get("data", {}) for o in tags[tag]["outputs"]), tag
    bar = "".join("".join(o.get("data", {}).get("text/html", "")) for o in tags["fit"]["outputs"])
    assert "<progress" in bar and "epoch 3/3" in bar
