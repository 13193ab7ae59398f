"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

* The notebooks and example scripts stay where they are (``notebooks/``, ``examples/``); the
  site serves a copy of each under the same path, so a page links to them as
  ``notebooks/quickstart_engine.ipynb`` (from a page in ``docs/``) and the strict build checks
  the link like any other.
* Docstrings in ``sparkdl/`` name objects with Sphinx roles (``:class:`sparkdl.FitSet```); the
  API pages show them as code, the role dropped (``~a.b.C`` shows ``C``, as in Sphinx).
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


def _code(match: re.Match) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, page, config, files) -> str:
    return _ROLE.sub(_code, html)
