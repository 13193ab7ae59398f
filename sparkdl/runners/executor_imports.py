"""Recognising a job that failed because the executors' Python cannot import sparkdl (driver
side).

Every task unpickles functions of sparkdl's executor modules, so an executor whose interpreter
lacks sparkdl, or finds another project's module of that name first, fails the first task it
runs with ``ModuleNotFoundError: No module named 'sparkdl'`` (or ``'sparkdl.executor'``, or an
``ImportError`` naming sparkdl). Spark retries the task and then fails the job; a rebuild of
the shards cannot help, so the fit ends with :class:`~sparkdl.errors.ExecutorImportError`,
which says how to ship sparkdl to the executors.

Example::

    line = missing_sparkdl_reason(exc)
    if line is not None:
        raise executor_import_error("building the training shards", line) from exc
"""

from __future__ import annotations

import re

from ..errors import ExecutorImportError, exception_text

__all__ = ["missing_sparkdl_reason", "executor_import_error"]

_IMPORT_FAILURE = re.compile(r"(ModuleNotFoundError|ImportError): .*\bsparkdl\b")


def missing_sparkdl_reason(exc: BaseException | str) -> str | None:
    """The line of a failed job's error (or of its text) saying that a task's Python could not
    import sparkdl or one of its modules, or None.

    Example::

        missing_sparkdl_reason("ModuleNotFoundError: No module named 'sparkdl'")
        # "ModuleNotFoundError: No module named 'sparkdl'"
    """
    text = exc if isinstance(exc, str) else exception_text(exc)
    for line in text.splitlines():
        found = _IMPORT_FAILURE.search(line)
        if found is not None:
            return line[found.start():].strip()[:300]
    return None


def executor_import_error(what: str, line: str) -> ExecutorImportError:
    """The error that ends a fit whose job ``what`` failed because the executors cannot import
    sparkdl (``line``: what the task said, from :func:`missing_sparkdl_reason`).

    Example::

        raise executor_import_error("iteration 1", line) from exc
    """
    return ExecutorImportError(
        f"{what}: the executors' Python cannot import sparkdl-torch ({line}). The driver has "
        "it; the interpreter the executors run (spark.pyspark.python, PYSPARK_PYTHON) does "
        "not, or it finds another project's module named sparkdl first (an ML runtime's own "
        "sparkdl, or the older PyPI package of that name). Get sparkdl-torch to the executors "
        "in one of three ways: install it into the executors' Python on every node "
        "(pip install sparkdl-torch); ship a zip of the package directory with "
        "--py-files sparkdl.zip (a .whl given to --py-files is not put on the executors' "
        "path); or ship a packed environment holding it with --archives env.tar.gz#env and "
        "spark.pyspark.python=./env/bin/python (conda-pack carries the interpreter; venv-pack "
        "needs its base interpreter at the same path on every node). Nothing was rebuilt: the "
        "executors' data is not at fault. See the Deployment guide (docs/guide/deployment.md).")
