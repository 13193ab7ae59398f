"""A pass's summed vector back into its fits' own results (driver side).

A pass (:mod:`sparkdl.engine.fit_set`) sums every fit's vector, one after another, in one
AllReduce; each task reports a :class:`sparkdl.executor.tasks.PassReport` holding every fit's
own report. :func:`split_pass_result` gives each fit the
:class:`~sparkdl.transport.allreduce.AllReduceResult` its own job would have given: its part of
the vector (None when no partition had rows for it), its tasks' reports, and the job's times.

Example::

    first, second = split_pass_result(result, [layout_a.size, layout_b.size])
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .allreduce import AllReduceResult

__all__ = ["split_pass_result"]


def split_pass_result(result: AllReduceResult, sizes: Sequence[int]) -> list[AllReduceResult]:
    """Each fit's result from the pass's ``result`` (``sizes``: the fits' vector lengths, in
    the pass's order)."""
    out, at = [], 0
    for k, size in enumerate(sizes):
        span = (at, at + size)
        contributed = any(span not in r.absent for r in result.reports)
        vector = (result.vector[at:at + size]
                  if result.vector is not None and contributed else None)
        out.append(dataclasses.replace(result, vector=vector, rows=None, pending=None,
                                       pending_blocks=None,
                                       reports=[r.fits[k] for r in result.reports]))
        at += size
    return out
