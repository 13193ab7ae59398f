"""Which code is fixed by what is installed, and how it is named (driver side).

The fit identity (:mod:`sparkdl.engine.fit.resume.content_digest`) names code it may trust to
be what its name says, and hashes the rest by content:

* the standard library and built-in modules: by module name (and ``__version__`` where the
  module has one): the interpreter fixes their code;
* a package installed from a distribution (a wheel or sdist in site-packages, not editable): by
  its distribution's version, read from the installed metadata (``importlib.metadata``), never
  from a ``__version__`` attribute, which many packages (most users' own) do not define. A
  package whose code changes must change its version: reinstalling other code under the same
  version is not seen;
* everything else, by content: the user's own modules, editable installs, and modules in
  site-packages that no distribution owns (copied there by hand).

Example::

    library_version("torch")        # "2.13.0+cpu": identified by name and this version
    library_version("my_models")    # None: hashed by its code
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import sys
import sysconfig

__all__ = ["library_version"]

_LIBRARY_ROOTS = tuple(os.path.realpath(p) for p in
                       {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                            "platlib")} if p)
_STANDARD = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ()))


@functools.lru_cache(maxsize=1)
def _owners() -> dict[str, list[str]]:
    """Top-level import name -> the distributions that install it (read once per process)."""
    return importlib.metadata.packages_distributions()


def _editable(distribution: str) -> bool:
    try:
        text = importlib.metadata.distribution(distribution).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return True                    # listed but gone: nothing vouches for its code
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable", False))
    except (ValueError, AttributeError):
        return False


def _installed_path(top: str) -> bool:
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None)
    if path is None:
        return top in ("torch", "numpy")
    path = os.path.realpath(path)
    return any(path.startswith(root + os.sep) for root in _LIBRARY_ROOTS) or \
        "site-packages" in path or "dist-packages" in path


@functools.lru_cache(maxsize=None)
def library_version(module_name: str) -> str | None:
    """How the installed code of ``module_name`` is versioned, or None when it is hashed by
    content instead (see the module docstring). The standard library gives the module's
    ``__version__`` ("" for most); a distribution its version (one distribution), or
    ``"name version; ..."`` (a namespace package several distributions share)."""
    top = module_name.split(".")[0]
    if top in _STANDARD or top == "builtins":
        return str(getattr(sys.modules.get(top), "__version__", ""))
    if not _installed_path(top):
        return None
    owners = sorted(set(_owners().get(top, ())))
    if not owners or any(_editable(name) for name in owners):
        return None
    versions = [(name, importlib.metadata.version(name)) for name in owners]
    if len(versions) == 1:
        return versions[0][1]
    return "; ".join(f"{name} {version}" for name, version in versions)
