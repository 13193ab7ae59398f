"""What rounds a fit's arithmetic besides the fit itself: the numeric platform (driver side).

The same fit gives bitwise the same weights only where its tensor kernels round the same way:
the same torch build, the same vectorized kernels (ATen's CPU capability), the same BLAS on the
same code path (MKL picks its kernels by CPU model and vendor, and ``MKL_CBWR`` pins another),
the same CPU. None of this is in the fit's identity: a checkpoint carried to another machine
is still its fit's and resumes there, continuing exactly from the checkpoint's weights. But the
iterations after it round as the new platform does, so the result can differ in its last bits
from a fit trained on either platform throughout. Each checkpoint therefore records the
platform of the driver that wrote it (:func:`numeric_platform`), and a resume on a platform
that differs logs what differs (:func:`platform_differences`). Executors compute the gradients:
on a cluster their machines count as well; the driver's record names the usual case of a job
moved to other hardware or another torch.

Example::

    numeric_platform()
    # {'torch': '2.13.0+cpu', 'machine': 'x86_64', 'cpu': 'AMD EPYC',
    #  'cpu_capability': 'AVX512', 'blas': 'mkl', 'mkl_cbwr': ''}
    platform_differences(recorded, numeric_platform())
    # ["cpu 'Intel(R) Xeon(R) Platinum 8480+' (here 'AMD EPYC')"]
"""

from __future__ import annotations

import functools
import os
import platform
import re
from typing import Mapping

import torch

__all__ = ["numeric_platform", "platform_differences"]


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what :mod:`platform` reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _blas() -> str:
    """The BLAS torch was built with (``BLAS_INFO`` of its build configuration)."""
    match = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return match.group(1) if match else ""


@functools.lru_cache(maxsize=1)
def _fixed_part() -> tuple[tuple[str, str], ...]:
    """What cannot change within one process (read once: torch's build text is long)."""
    parts = (("torch", torch.__version__), ("machine", platform.machine()), ("cpu", _cpu_model()),
             ("cpu_capability", torch.backends.cpu.get_cpu_capability()), ("blas", _blas()))
    return tuple((name, str(value)) for name, value in parts)   # plain str: weights_only loads


def numeric_platform() -> dict[str, str]:
    """The platform this process's tensor kernels round on: torch's version, the machine's
    architecture and CPU model, ATen's CPU capability, the BLAS and ``MKL_CBWR``."""
    return {**dict(_fixed_part()), "mkl_cbwr": os.environ.get("MKL_CBWR", "")}


def platform_differences(recorded: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """Each entry of ``recorded`` that ``here`` has otherwise, as ``"name 'theirs' (here
    'ours')"``; entries only one side knows are not compared (a newer sparkdl may record
    more)."""
    return [f"{name} {recorded[name]!r} (here {here[name]!r})"
            for name in sorted(set(recorded) & set(here)) if recorded[name] != here[name]]
