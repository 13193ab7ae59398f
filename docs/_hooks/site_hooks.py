"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

* The notebooks and example scripts stay where they are (``notebooks/``, ``examples/``); the
  site serves a copy of each under the same path, so a page links to them as
  ``notebooks/quickstart_engine.ipynb`` (from a page in ``docs/``) and the strict build checks
  the link like any other.
* Docstrings in ``sparkdl/`` are written for Sphinx and for reading in the source: on the API
  pages a role (``:class:`sparkdl.FitSet```) shows as code, the role dropped (``~a.b.C`` shows
  ``C``, as in Sphinx); reST's literal-block marker (``Example::``) shows as one colon; and a
  type written in angle brackets outside backticks (``array<double>``), which Markdown passes
  on as an unknown HTML tag that browsers hide, shows as text.
"""

from __future__ import annotations

import glob
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
    return files


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
