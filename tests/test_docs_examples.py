"""The documentation's code examples run: every Python example of README.md and docs/**/*.md.

The convention (told to readers in docs/getting-started.md, "The code on these pages"):

* A fenced block whose language is ``python`` is an example and runs here, unless the paragraph
  just above it starts with ``*Not run:``, which gives the reason on the page itself (in
  italics, on GitHub and on the site alike).
* Shell blocks (``bash``, ``sh``, ``shell``, ``console``) never run here: each must give such a
  reason too, except the README's two commands at its top (the main job and the tests), which
  CI runs itself (the test command must stand verbatim in .ci/run).
* Other blocks (``text``: diagrams, logs, output) are not examples.
* The examples of one page run in order in one namespace, like the cells of a notebook, in a
  fresh temporary working directory. The namespace starts with ``spark`` (the suite's
  ``local[2]`` session, conftest.py) and ``sc``, as the pyspark shell and notebooks have them;
  nothing else is given: each page builds its own small data.
* A page whose examples import an optional extra that is not installed (mlflow, optuna, ...) is
  skipped, naming it; the README's test venv has every extra, so CI runs them all.

Only markdown is read: this needs neither mkdocs nor the ``docs`` extra. A failing example's
traceback names the markdown file and the line in it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL = {"bash", "sh", "shell", "console", "zsh"}
NOT_RUN = "*Not run:"
# Extras a page may need that a test venv without them lacks (pyproject.toml's extras).
OPTIONAL = {"mlflow", "optuna", "transformers", "lightning", "tensorboard", "matplotlib"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass
class Block:
    path: str           # relative to the repository root
    line: int           # of the first code line, 1-based
    lang: str
    code: str
    reason: str | None  # the visible "Not run" reason, if any

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def markdown_files() -> list[str]:
    found = ["README.md"]
    for folder, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found += sorted(os.path.relpath(os.path.join(folder, f), ROOT)
                        for f in files if f.endswith(".md"))
    return found


def blocks(path: str) -> list[Block]:
    """The fenced code blocks of a markdown file, with the "Not run" reason above each."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, k = [], 0
    while k < len(lines):
        opening = _FENCE.match(lines[k])
        if not opening:
            k += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        lang = (opening.group("info").split() or [""])[0].lower()
        end = k + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[k + 1:end]]
        above = k - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        paragraph = []
        while above >= 0 and lines[above].strip():
            paragraph.insert(0, lines[above].strip())
            above -= 1
        text = " ".join(paragraph)
        reason = text[len(NOT_RUN):].strip().rstrip("*").strip() if text.startswith(NOT_RUN) \
            else None
        found.append(Block(path, k + 2, lang, "\n".join(body), reason))
        k = end + 1
    return found


def runnable(path: str) -> list[Block]:
    return [b for b in blocks(path) if b.lang == "python" and b.reason is None]


ALL_BLOCKS = [b for path in markdown_files() for b in blocks(path)]
# A page whose examples are, in order, exactly an earlier page's (getting-started.md repeats the
# README's two) runs as that page did: the same code in the same fresh namespace.
_SEEN: dict[tuple[str, ...], str] = {}
PAGES = [_SEEN.setdefault(key, path) for path in markdown_files()
         for key in [tuple(b.code for b in runnable(path))] if key and key not in _SEEN]
COPIES = {path: _SEEN[key] for path in markdown_files()
          for key in [tuple(b.code for b in runnable(path))] if key and _SEEN[key] != path}


def readme_commands() -> list[Block]:
    """The README's two commands at its top: the main job, then the tests."""
    return [b for b in blocks("README.md") if b.lang in SHELL][:2]


def test_every_example_runs_or_says_why_not():
    readme_top = {b.where for b in readme_commands()}
    unmarked_shell = [b.where for b in ALL_BLOCKS
                      if b.lang in SHELL and b.reason is None and b.where not in readme_top]
    assert not unmarked_shell, (
        f"shell blocks neither run nor marked: {unmarked_shell}; put a line '{NOT_RUN} <the "
        "reason>*' just above each")
    empty = [b.where for b in ALL_BLOCKS if b.reason is not None and len(b.reason) < 10]
    assert not empty, f"'Not run' without a reason: {empty}"
    examples = [b for b in ALL_BLOCKS if b.lang == "python" and b.reason is None]
    assert len(examples) >= 15 and "README.md" in PAGES, [b.where for b in examples]
    assert set(PAGES) | set(COPIES) == {b.path for b in examples}


def test_readme_commands_are_the_ones_ci_runs():
    main_job, tests = readme_commands()
    assert "examples/lenet_fashion_mnist_engine.py" in main_job.code
    assert os.path.isfile(os.path.join(ROOT, "examples", "lenet_fashion_mnist_engine.py"))
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read().split("\n")
    assert tests.code.strip() in ci, "the README's test command is not a line of .ci/run"


def test_readme_links_to_files_that_exist():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", f.read())
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert local, "the README links into the docs"
    missing = [t for t in local if not os.path.exists(os.path.join(ROOT, t))]
    assert not missing, missing


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    name = (exc.name or "").split(".")[0]
    return name if name in OPTIONAL and importlib.util.find_spec(name) is None else None


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page, spark, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    tracking_uri = _mlflow_tracking_uri()
    torch_rng = torch.get_rng_state()      # an example may seed torch's global generator
    namespace = {"__name__": "docs_examples_" + re.sub(r"\W", "_", page),
                 "spark": spark, "sc": spark.sparkContext}
    try:
        for block in runnable(page):
            # Padded so that a traceback's line numbers are the markdown file's.
            code = compile("\n" * (block.line - 1) + block.code, block.path, "exec")
            try:
                exec(code, namespace)
            except ModuleNotFoundError as exc:
                extra = _missing_extra(exc)
                if extra is None:
                    raise
                pytest.fail(f"{block.where} needs {extra}, which the test extra installs: "
                            "run the README's test command (never skipped: an example that "
                            "does not run is not checked)")
    finally:
        torch.set_rng_state(torch_rng)
        if tracking_uri is not None or "mlflow" in sys.modules:
            import mlflow

            mlflow.set_tracking_uri(tracking_uri)


def _mlflow_tracking_uri() -> str | None:
    """MLflow's tracking URI before a page runs (restored after it), if MLflow is imported."""
    if "mlflow" not in sys.modules:
        return None
    import mlflow

    return mlflow.get_tracking_uri()
