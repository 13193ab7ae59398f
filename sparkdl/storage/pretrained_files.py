"""A pretrained model's directory (what ``save_pretrained`` wrote) as the driver and the
executors reach it: its content identity, a few of its tensors, and a local copy.

* :func:`base_identity`: the directory identified by content without reading it whole. Each
  file contributes its name and size; a ``.safetensors`` file also its header (every tensor's
  name, dtype, shape and byte range), the whole bytes of every tensor of at most
  :data:`WHOLE_TENSOR_BYTES`, and :data:`SAMPLES` evenly spaced blocks of
  :data:`SAMPLE_BYTES` of every larger tensor; any other file (``config.json``, a tokenizer's
  files) its whole bytes up to :data:`WHOLE_FILE_BYTES`, then samples. What it assumes: two
  bases that differ do so in a file's size, a header, a small tensor (a head, a norm, a bias),
  or in the sampled blocks of a large tensor, as a full fine-tune changes nearly every weight.
  An edit confined to a few rows of one large tensor that no sample covers goes unnoticed:
  save such a base under a new directory with another file set, or give the fit a name
  (``set_fit_identity``). A 7B base in bf16 costs about 50 MiB of reads, not 14 GB.
* :func:`read_tensors`: named tensors of the directory's ``.safetensors`` files, read by their
  byte ranges alone (the driver reads only the base tensors it trains, e.g. a classification
  head that ``modules_to_save`` copies, and the persistent buffers).
* :func:`local_copy`: where a task reads the directory: the path itself when it is on this
  machine, else a copy made once per executor under ``spark.local.dir`` (a temporary name, then
  a rename, so that concurrent tasks never read half a copy).

Paths are local paths, ``file:`` URIs, or any URI ``pyarrow.fs`` reaches (``s3://``,
``hdfs://`` with libhdfs, ``gs://``): :func:`sparkdl.storage.arrow_files.resolve`.

Example::

    base_identity("/models/tiny-llama")          # a hex digest
    read_tensors("/models/tiny-bert", ["classifier.weight"])
    local_copy("s3://bucket/tiny-llama")        # a local directory
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import struct
import tempfile
import uuid
from typing import Any, Iterable

from .arrow_files import resolve
from .local_paths import local_path

__all__ = ["base_identity", "read_tensors", "local_copy", "safetensors_header", "list_files",
           "WHOLE_TENSOR_BYTES", "SAMPLE_BYTES", "SAMPLES", "WHOLE_FILE_BYTES"]

WHOLE_TENSOR_BYTES = 1 << 20
"""Tensors of at most this many bytes enter the identity whole."""
SAMPLE_BYTES = 4096
"""The size of each sampled block of a larger tensor."""
SAMPLES = 16
"""Sampled blocks per larger tensor."""
WHOLE_FILE_BYTES = 16 << 20
"""Files other than safetensors of at most this size enter the identity whole."""

_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                 "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                 "BOOL": "bool"}


def list_files(path: str) -> list[tuple[str, int]]:
    """``(relative name, size)`` of every file under the directory ``path``, sorted."""
    from pyarrow import fs

    system, root = resolve(path)
    info = system.get_file_info(root)
    if info.type != fs.FileType.Directory:
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"The pretrained model's path {path!r} is not a directory: give the directory that "
            "save_pretrained wrote (config.json and the .safetensors weights).")
    found = system.get_file_info(fs.FileSelector(root, recursive=True))
    return sorted((posixpath.relpath(f.path, root), int(f.size)) for f in found
                  if f.type == fs.FileType.File)


def _read_range(handle: Any, start: int, length: int) -> bytes:
    handle.seek(start)
    return bytes(handle.read(length))


def safetensors_header(handle: Any) -> tuple[dict[str, Any], int]:
    """The header of an open ``.safetensors`` file and where its data begins."""
    (length,) = struct.unpack("<Q", _read_range(handle, 0, 8))
    return json.loads(_read_range(handle, 8, length)), 8 + length


def base_identity(path: str) -> str:
    """The hex SHA-256 identifying the directory ``path`` by content (see the module
    docstring for what it reads and assumes)."""
    system, root = resolve(path)
    digest = hashlib.sha256()
    for name, size in list_files(path):
        digest.update(f"file {name} {size}\n".encode())
        with system.open_input_file(posixpath.join(root, name)) as handle:
            if name.endswith(".safetensors"):
                header, data_start = safetensors_header(handle)
                digest.update(json.dumps(header, sort_keys=True).encode())
                for tensor, entry in sorted(header.items()):
                    if tensor == "__metadata__":
                        continue
                    begin, end = (data_start + int(o) for o in entry["data_offsets"])
                    for start, length in _spans(begin, end):
                        digest.update(_read_range(handle, start, length))
            else:
                for start, length in _spans(0, size, WHOLE_FILE_BYTES):
                    digest.update(_read_range(handle, start, length))
    return digest.hexdigest()


def _spans(begin: int, end: int, whole: int = WHOLE_TENSOR_BYTES) -> list[tuple[int, int]]:
    """The byte ranges of ``[begin, end)`` that enter the identity."""
    size = end - begin
    if size <= whole:
        return [(begin, size)]
    step = (size - SAMPLE_BYTES) / (SAMPLES - 1)
    return [(begin + int(i * step), SAMPLE_BYTES) for i in range(SAMPLES)]


def read_tensors(path: str, names: Iterable[str]) -> dict[str, Any]:
    """The named tensors of the directory's ``.safetensors`` files (torch tensors), each read by
    its byte range alone; names not found are left out."""
    import torch

    wanted = set(names)
    system, root = resolve(path)
    found: dict[str, Any] = {}
    for name, _ in list_files(path):
        if not wanted or not name.endswith(".safetensors"):
            continue
        with system.open_input_file(posixpath.join(root, name)) as handle:
            header, data_start = safetensors_header(handle)
            for tensor in sorted(wanted & set(header)):
                entry = header[tensor]
                begin, end = (data_start + int(o) for o in entry["data_offsets"])
                raw = bytearray(_read_range(handle, begin, end - begin))
                dtype = getattr(torch, _TORCH_DTYPES[entry["dtype"]])
                value = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
                found[tensor] = value.reshape(entry["shape"]).clone()
                wanted.discard(tensor)
    return found


def local_copy(path: str, identity: str) -> str:
    """A directory on this machine holding ``path``'s files: ``path`` itself when local, else
    a copy under ``spark.local.dir`` (or the temporary directory), made once per machine and
    named by ``identity``."""
    local = local_path(path)
    if local is not None:
        return local
    root = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir()
    target = os.path.join(root, "sparkdl-pretrained", identity[:32])
    if os.path.isdir(target):
        return target
    system, source = resolve(path)
    partial = f"{target}.{uuid.uuid4().hex}.partial"
    try:
        for name, _ in list_files(path):
            destination = os.path.join(partial, *name.split("/"))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            with system.open_input_stream(posixpath.join(source, name)) as src, \
                    open(destination, "wb") as out:
                shutil.copyfileobj(src, out, 8 << 20)
        try:
            os.rename(partial, target)
        except OSError:                 # another task of this machine made it first
            if not os.path.isdir(target):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
