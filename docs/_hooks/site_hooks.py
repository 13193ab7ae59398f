"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

* The notebooks and example scripts stay where they are (``notebooks/``, ``examples/``); the
  site serves a copy of each under the same path, so a page links to them as
  ``notebooks/quickstart_engine.ipynb`` (from a page in ``docs/``) and the strict build checks
  the link like any other.
* Each notebook is also a page, ``notebooks/<name>.md`` in the navigation, made from its stored
  cells and outputs: markdown cells as they are, code cells in Python fences, printed text in
  text fences, HTML outputs (tables, the progress bar) as HTML, and PNG outputs (the plots) as
  image files beside the page (``notebooks/images/<name>-<n>.png``). The notebooks are stored
  with their outputs (``docs/_figures/store_notebook_outputs.py``), so the build runs nothing.
* Docstrings in ``sparkdl/`` are written for Sphinx and for reading in the source: on the API
  pages a role (``:class:`sparkdl.FitSet```) shows as code, the role dropped (``~a.b.C`` shows
  ``C``, as in Sphinx); reST's literal-block marker (``Example::``) shows as one colon; and a
  type written in angle brackets outside backticks (``array<double>``), which Markdown passes
  on as an unknown HTML tag that browsers hide, shows as text.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re

from mkdocs.structure.files import File, Files

REPOSITORY_FILES = ("notebooks/*.ipynb", "examples/*.py")

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|obj|exc|const):"
                   r"<code>(~?)([^<]*)</code>")


def on_files(files: Files, config, **kwargs) -> Files:
    root = os.path.dirname(os.path.abspath(config["config_file_path"]))
    for pattern in REPOSITORY_FILES:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            src_uri = os.path.relpath(path, root).replace(os.sep, "/")
            files.append(File.generated(config, src_uri, abs_src_path=path))
            if path.endswith(".ipynb"):
                for page_file in notebook_files(config, src_uri, path):
                    files.append(page_file)
    return files


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _fence(text: str, lang: str) -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def notebook_markdown(notebook: dict, image_uri) -> tuple[str, list[tuple[str, bytes]]]:
    """A notebook as a page's markdown, and its PNG outputs as (file name, bytes).

    ``image_uri(n)`` names the n-th image relative to the page."""
    parts: list[str] = []
    images: list[tuple[str, bytes]] = []
    for cell in notebook["cells"]:
        source = _text(cell["source"])
        if cell["cell_type"] == "markdown":
            parts.append(source.rstrip() + "\n")
            continue
        if cell["cell_type"] != "code" or not source.strip():
            continue
        parts.append(_fence(source, "python"))
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if output["output_type"] == "stream":
                parts.append(_fence(_text(output["text"]), "text"))
            elif "image/png" in data:
                name = image_uri(len(images) + 1)
                images.append((name, base64.b64decode(_text(data["image/png"]))))
                parts.append(f"![output of the cell above]({name})\n")
            elif "text/html" in data:
                parts.append(f'<div class="notebook-output" markdown="0">\n'
                             f'{_text(data["text/html"]).strip()}\n</div>\n')
            elif "text/plain" in data:
                parts.append(_fence(_text(data["text/plain"]), "text"))
            elif output["output_type"] == "error":
                parts.append(_fence("\n".join(output.get("traceback", [])), "text"))
    return "\n".join(parts), images


def notebook_files(config, src_uri: str, path: str) -> list[File]:
    """The page of one notebook and its images."""
    with open(path, encoding="utf-8") as f:
        notebook = json.load(f)
    folder, name = src_uri.rsplit("/", 1)
    stem = name[: -len(".ipynb")]
    markdown, images = notebook_markdown(notebook, lambda n: f"images/{stem}-{n}.png")
    markdown += (f"\n---\n\nThis page is the notebook [`{name}`]({name}) with the outputs it "
                 "stored when it last ran; download it to run it yourself.\n")
    found = [File.generated(config, f"{folder}/{stem}.md", content=markdown)]
    found += [File.generated(config, f"{folder}/{image}", content=data) for image, data in images]
    return found


# Tags that Markdown, mkdocstrings and autorefs put into the API pages; any other "<name>" is
# docstring text.
_HTML_TAGS = {"a", "abbr", "article", "autoref", "b", "blockquote", "br", "code", "dd", "del", "details",
              "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img",
              "kbd", "li", "ol", "p", "pre", "s", "section", "small", "span", "strong", "sub",
              "summary", "sup", "table", "tbody", "td", "th", "thead", "tr", "u", "ul"}
_TAG = re.compile(r"<(/?)([A-Za-z][\w-]*)([^<>]*)>")
_LITERAL_MARKER = re.compile(r"::</p>")


def _tag(match: re.Match) -> str:
    if match.group(2).lower() in _HTML_TAGS:
        return match.group(0)
    return match.group(0).replace("<", "&lt;").replace(">", "&gt;")


def _code(match: re.Match) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, page, config, files) -> str:
    if not page.file.src_uri.startswith("api/"):
        return html
    html = _TAG.sub(_tag, html)
    html = _LITERAL_MARKER.sub(":</p>", html)
    return _ROLE.sub(_code, html)
