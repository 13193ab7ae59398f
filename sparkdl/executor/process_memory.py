"""Resident memory of the current process (driver or Python worker), for the training summary.

Example::

    from sparkdl.executor.process_memory import current_rss_bytes, peak_rss_bytes
    current_rss_bytes(), peak_rss_bytes()
"""

from __future__ import annotations

import os
import resource
import sys

__all__ = ["current_rss_bytes", "peak_rss_bytes"]


def current_rss_bytes() -> int:
    """Resident set size now (Linux: /proc/self/statm; elsewhere the peak as an upper bound)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Largest resident set size this process has had."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
