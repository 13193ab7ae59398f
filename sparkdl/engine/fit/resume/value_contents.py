"""The contents of values whose objects do not show them as attributes, read for
:mod:`.content_digest`: a tensor's elements as bytes, a pandas object's labels, dtypes and rows,
a TorchScript module's code.

Example: ``tensor_bytes(torch.ones(2))`` is the 8 bytes of two float32 ones."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch


def pandas_content(value: Any) -> dict[str, Any]:
    """What a pandas object holds: its labels (an index walked the same way), dtypes, ``attrs``
    and a stable 64-bit hash of each row (pandas' own, with its fixed key), or its cells where
    pandas cannot hash them (lists)."""
    import pandas as pd

    if isinstance(value, pd.Index):
        content: dict[str, Any] = {"dtype": repr(value.dtype), "names": list(value.names)}
    elif isinstance(value, pd.Series):
        content = {"name": value.name, "dtype": repr(value.dtype), "index": value.index,
                   "attrs": value.attrs}
    else:
        content = {"columns": value.columns, "dtypes": [repr(d) for d in value.dtypes],
                   "index": value.index, "attrs": value.attrs}
    try:
        content["rows"] = pd.util.hash_pandas_object(value, index=False).to_numpy()
    except TypeError:
        content["cells"] = np.asarray(value.to_numpy(), dtype=object)
    return content


def is_pandas(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame, Series or Index (pandas never imported here)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, (pd.DataFrame, pd.Series, pd.Index))


def tensor_header(value: torch.Tensor) -> str:
    """The tensor's dtype, shape and ``requires_grad``."""
    return f"{value.dtype}{list(value.shape)}{value.requires_grad}"


def tensor_bytes(value: torch.Tensor) -> Any:
    """The tensor's elements as a flat uint8 buffer (dense, on the CPU, contiguous)."""
    t = value.detach()
    if t.is_sparse:
        t = t.to_dense()
    t = t.cpu().contiguous()
    return t.view(-1).view(torch.uint8).numpy() if t.numel() else b""


def script_code(module: torch.jit.ScriptModule) -> str | None:
    """The module's TorchScript code, None for a module without any."""
    try:
        return module.code
    except Exception:              # noqa: BLE001 - a module without TorchScript code
        return None
