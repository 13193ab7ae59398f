"""Which paths name this machine's file system, and where: the one decision behind the
exchange directory's privacy (``0700``/``0600`` on local paths) and the local file system of
:mod:`sparkdl.storage.arrow_files`.

A path is local when it is plain (``/data/x``, ``data/x``, resolved against the working
directory of the process that calls :func:`local_path`), or a ``file:`` URI without a host or
with ``localhost`` in every spelling Hadoop, pyarrow and RFC 8089 use: ``file:/data/x``,
``file:///data/x`` and ``file://localhost/data/x``. Percent escapes in a ``file:`` URI are
decoded (``file:///a%20b`` is ``/a b``), as ``pyarrow.fs`` does. Anything else with a scheme
(``s3://``, ``hdfs://``, ``hdfs:/x``, ``file://otherhost/x``) is not local.

Example::

    local_path("file:///tmp/x")     # '/tmp/x'
    local_path("s3://bucket/x")     # None
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

__all__ = ["local_path"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")
"""A URI's scheme (two characters at least, so that a drive letter is not one)."""

_LOCAL_HOSTS = ("", "localhost")


def local_path(path: str) -> str | None:
    """The absolute local path that ``path`` names, or ``None`` when it names another file
    system (see the module docstring for the spellings)."""
    match = _SCHEME.match(path)
    if match is None:
        return os.path.abspath(path)
    if match.group(1).lower() != "file":
        return None
    rest = path[match.end():]
    if rest.startswith("//"):                  # file://host/path
        host, slash, inner = rest[2:].partition("/")
        if host.lower() not in _LOCAL_HOSTS:
            return None
        rest = slash + inner
    # a relative file: URI (file:data/x) is read against the working directory, as Hadoop does
    return os.path.abspath(unquote(rest))
