"""A pass's summed vector back into its fits' own results (driver side).

A pass (:mod:`sparkdl.engine.fit_set`) sums every fit's vector, one after another, in one
AllReduce; each task reports a :class:`sparkdl.executor.tasks.PassReport` holding every fit's
own report, and every fit's embedding tables' rows keyed ``(fit, parameter)``.
:func:`split_pass_result` gives each fit the
:class:`~sparkdl.transport.allreduce.AllReduceResult` its own job would have given: its part of
the vector (None when no partition had rows for it), its tables' rows (summed by the shuffle's
reducers, or left in its tasks' reports for the driver to sum, as its own job leaves them), its
tasks' reports, and the job's times.

Example::

    first, second = split_pass_result(result, [layout_a.size, layout_b.size])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from .allreduce import AllReduceResult

__all__ = ["split_pass_result", "pass_table_rows"]


def pass_table_rows(layouts: Sequence[Any]) -> dict[tuple[int, int], int]:
    """The number of rows of every fit's embedding tables, keyed ``(fit, parameter)`` (a
    pass's shuffle cuts each into its blocks' id ranges as a single fit's does)."""
    return {(k, p): layout.params[p].shape[0] for k, layout in enumerate(layouts)
            for p in layout.tables}


def split_pass_result(result: AllReduceResult, sizes: Sequence[int]) -> list[AllReduceResult]:
    """Each fit's result from the pass's ``result`` (``sizes``: the fits' vector lengths, in
    the pass's order)."""
    out, at = [], 0
    summed = result.rows
    for k, size in enumerate(sizes):
        span = (at, at + size)
        contributed = any(span not in r.absent for r in result.reports)
        vector = (result.vector[at:at + size]
                  if result.vector is not None and contributed else None)
        reports = [_fit_report(r, k) for r in result.reports]
        rows = None if summed is None else {p: v for (f, p), v in summed.items() if f == k}
        out.append(dataclasses.replace(result, vector=vector, rows=rows, pending=None,
                                       pending_blocks=None, reports=reports))
        at += size
    return out


def _fit_report(report: Any, k: int) -> Any:
    """Fit ``k``'s own task report, with its tables' rows when the pass's report still holds
    them (the driver sums them, as for a single fit)."""
    own = report.fits[k]
    rows = {p: v for (f, p), v in (report.table_rows or {}).items() if f == k}
    return dataclasses.replace(own, table_rows=rows) if rows else own
