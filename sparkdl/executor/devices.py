"""Which torch device a task computes on (executor side; the decision is a plain function).

Spark assigns GPUs to tasks (``spark.executor.resource.gpu.amount`` with
``spark.task.resource.gpu.amount``, or a task resource profile) and a task reads its share from
``TaskContext.get().resources()["gpu"].addresses``. An address indexes the GPUs this executor
process sees: when ``CUDA_VISIBLE_DEVICES`` is set, address ``"1"`` is its second entry (the
physical GPU named there, as TorchDistributor maps them), which torch calls ``cuda:1``; without
it, the address is the physical index and torch's ordinal alike. With a fractional task amount
several tasks share one address.

The rule of ``device``: ``"cpu"``: always the CPU. ``"auto"``: the task's first assigned GPU
when it has one and CUDA is available, else the CPU. ``"cuda"``: the task's first assigned GPU;
a task with no GPU assigned, or on a machine where CUDA is not available, fails with an error
saying which. A reused Python worker may see a different address in every task, so replicas are
cached per device (:mod:`sparkdl.executor.replicas`). CUDA is never touched before a task needs
it (the PySpark daemon forks workers, and a CUDA context does not survive a fork).

Example::

    choice = choose_device("auto", ["1"], cuda_available=True, device_count=2,
                           visible_devices="4,5")
    choice.device, choice.physical     # "cuda:1", "5"
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..errors import SparkdlError

__all__ = ["DEVICES", "DeviceChoice", "choose_device", "task_gpu_addresses", "task_device",
           "DeviceError"]

DEVICES = ("auto", "cpu", "cuda")

log = logging.getLogger("sparkdl")

_LOGGED: set[tuple[str, str]] = set()


class DeviceError(SparkdlError, RuntimeError):
    """A task cannot use the device it was asked for."""

    permanent = True


@dataclass(frozen=True)
class DeviceChoice:
    """The device a task computes on, the physical GPU behind it (if any) and why."""

    device: str                 # "cpu" or "cuda:<ordinal>"
    physical: str | None
    reason: str


def choose_device(requested: str, addresses: list[str], cuda_available: bool,
                  device_count: int, visible_devices: str | None) -> DeviceChoice:
    """The device for a task that was assigned GPU ``addresses`` (see the module docstring)."""
    if requested == "cpu":
        return DeviceChoice("cpu", None, "device='cpu'")
    if not addresses:
        if requested == "cuda":
            raise DeviceError(
                "device='cuda' but Spark assigned this task no GPU: set "
                "spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount (and a "
                "discovery script or the cluster manager's GPU settings)")
        return DeviceChoice("cpu", None, "no GPU assigned to the task")
    if not cuda_available:
        if requested == "cuda":
            raise DeviceError(f"device='cuda': Spark assigned GPU {addresses[0]} to this task "
                              "but CUDA is not available in its Python worker (torch built "
                              "without CUDA, or no driver)")
        return DeviceChoice("cpu", None, f"GPU {addresses[0]} assigned but CUDA is not "
                                         "available")
    address = addresses[0]
    if not address.isdigit():
        raise DeviceError(f"GPU address {address!r} is not a device index")
    ordinal = int(address)
    visible = [v.strip() for v in visible_devices.split(",")] if visible_devices else None
    if ordinal >= device_count or (visible is not None and ordinal >= len(visible)):
        raise DeviceError(
            f"Spark assigned GPU address {address} but this process sees {device_count} "
            f"GPU(s)" + (f" (CUDA_VISIBLE_DEVICES={visible_devices})" if visible else "")
            + ": the discovery script and CUDA_VISIBLE_DEVICES disagree")
    physical = visible[ordinal] if visible is not None else address
    return DeviceChoice(f"cuda:{ordinal}", physical, f"GPU address {address}")


def _deterministic_cuda() -> None:
    """Deterministic kernels for GPU tasks (same seed, same weights): set before the first CUDA
    call of this process; ops without a deterministic kernel warn rather than fail."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def task_gpu_addresses() -> list[str]:
    """The GPU addresses Spark assigned to the running task (empty outside a task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return []
    gpu = ctx.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None else []


def task_device(requested: str) -> DeviceChoice:
    """The running task's device by the rule above; logged once per worker and decision."""
    if requested == "cpu":
        return DeviceChoice("cpu", None, "device='cpu'")
    import torch

    addresses = task_gpu_addresses()
    available = bool(addresses) and torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    choice = choose_device(requested, addresses, available, count,
                           os.environ.get("CUDA_VISIBLE_DEVICES"))
    if choice.device.startswith("cuda"):
        _deterministic_cuda()
    key = (choice.device, choice.reason)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("sparkdl task device: %s (%s)", choice.device, choice.reason)
    return choice
