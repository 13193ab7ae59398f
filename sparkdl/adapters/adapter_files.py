"""A fitted :class:`~sparkdl.adapters.PretrainedModel` as files: its adapter in ``peft``'s
format plus a reference to its base, and back; the merged full model on request.

The files of a fit (:func:`adapter_files`) are those ``PeftModel.save_pretrained`` writes
(``adapter_config.json``, ``adapter_model.safetensors``, peft's ``README.md``) and
:data:`REFERENCE_FILE`, the base by reference: its path, its content identity
(:func:`sparkdl.storage.pretrained_files.base_identity`), the auto class, the
``from_pretrained`` keywords and the fit's seed; never the base's weights. A directory of
them is what ``PeftModel.from_pretrained(base, directory)`` loads, and what
:func:`model_from_adapter_files` turns back into the driver's model (the base on the meta
device, the adapters as trained), after checking that the files at the base's path still have
the identity recorded.

:func:`merged_model` is the one place that holds the whole model on the driver: the base read
from its path, the adapters merged into it (``merge_and_unload``), a plain ``transformers``
model for ``save_pretrained`` or serving without ``peft``.

Example::

    save_adapter(trained, "/models/tiny-llama-lora")   # trained: optimize()'s peft model
    load_adapter("/models/tiny-llama-lora")            # the driver's model again
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir),
                              "/models/tiny-llama-lora")
    merged_model(trained).save_pretrained("/models/tiny-llama-merged")
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch
from torch import nn

from ..errors import InvalidArgumentError
from .pretrained import PretrainedModel, pretrained_origin, trainable_parameters

__all__ = ["REFERENCE_FILE", "ADAPTER_FILES", "adapter_files", "save_adapter", "load_adapter",
           "model_from_adapter_files", "merged_model", "base_reference"]

REFERENCE_FILE = "sparkdl_base.json"
"""The file beside the adapter naming its base (path, content identity, class, keywords, seed)."""

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files ``PeftModel.from_pretrained`` reads."""


def _origin(model: Any, what: str) -> tuple[PretrainedModel, int]:
    origin = pretrained_origin(model)
    if origin is None or origin[0].peft_config is None:
        raise InvalidArgumentError(
            f"{what} needs the model of a fit of PretrainedModel(..., peft_config=...) (what "
            f"optimize() returns, or a fitted NNModel's module). Got {type(model).__name__}.")
    return origin


def _keywords_json(kwargs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.dtype):
            value = {"torch_dtype": str(value).removeprefix("torch.")}
        try:
            json.dumps(value)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"The from_pretrained keyword {key}={value!r} of the PretrainedModel cannot be "
                "recorded beside the adapter (JSON values and torch dtypes only).") from exc
        out[key] = value
    return out


def _keywords_from_json(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(torch, v["torch_dtype"]) if isinstance(v, dict) and "torch_dtype" in v
            else v for k, v in kwargs.items()}


def base_reference(pretrained: PretrainedModel, seed: int) -> dict[str, Any]:
    """The reference to the base written beside an adapter (see the module docstring)."""
    if not isinstance(pretrained.auto_class, str):
        auto = f"{pretrained.auto_class.__module__}:{pretrained.auto_class.__qualname__}"
    else:
        auto = pretrained.auto_class
    return {"path": pretrained.path, "identity": pretrained.identity(), "auto_class": auto,
            "from_pretrained_kwargs": _keywords_json(pretrained.from_pretrained_kwargs),
            "seed": int(seed)}


def adapter_files(model: nn.Module) -> dict[str, bytes]:
    """The files of a fitted pretrained model's adapter (name -> bytes): peft's and
    :data:`REFERENCE_FILE`."""
    pretrained, seed = _origin(model, "Saving an adapter")
    reference = base_reference(pretrained, seed)
    for config in getattr(model, "peft_config", {}).values():
        config.base_model_name_or_path = pretrained.path    # not the driver's scratch copy
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        files = {}
        for name in sorted(os.listdir(scratch)):
            with open(os.path.join(scratch, name), "rb") as f:
                files[name] = f.read()
    files[REFERENCE_FILE] = json.dumps(reference, indent=2, sort_keys=True).encode()
    return files


def save_adapter(model: nn.Module, directory: str) -> str:
    """Write :func:`adapter_files` into the local ``directory`` (created); returns it."""
    os.makedirs(directory, exist_ok=True)
    for name, data in adapter_files(model).items():
        with open(os.path.join(directory, name), "wb") as out:
            out.write(data)
    return directory


def load_adapter(directory: str) -> nn.Module:
    """The driver's model of an adapter that :func:`save_adapter` wrote into the local
    ``directory`` (see :func:`model_from_adapter_files`): give it to ``DistriOptimizer`` to go
    on training, or to an ``NNModel`` to score."""
    files = {}
    for name in (*ADAPTER_FILES, REFERENCE_FILE):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                files[name] = f.read()
    return model_from_adapter_files(files)


def _auto_class(name: str) -> Any:
    if ":" not in name:
        return name
    import importlib

    module, _, qualname = name.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def model_from_adapter_files(files: dict[str, bytes]) -> nn.Module:
    """The driver's model of a saved adapter (the base on the meta device, the adapters and
    ``modules_to_save`` as saved), its base checked against the recorded identity."""
    from peft import PeftConfig, set_peft_model_state_dict
    from safetensors.torch import load as load_safetensors

    missing = [n for n in (*ADAPTER_FILES, REFERENCE_FILE) if n not in files]
    if missing:
        raise InvalidArgumentError(f"The saved adapter lacks {', '.join(missing)}: load a "
                                   "directory that a LoRA fit's save wrote.")
    reference = json.loads(files[REFERENCE_FILE])
    pretrained = PretrainedModel(reference["path"], _auto_class(reference["auto_class"]),
                                 **_keywords_from_json(reference["from_pretrained_kwargs"]))
    found = pretrained.identity()
    if found != reference["identity"]:
        raise InvalidArgumentError(
            f"The base at {reference['path']!r} is not the one this adapter was trained on: "
            f"its content identity is {found[:16]}..., the adapter records "
            f"{reference['identity'][:16]}.... Put the original base back at that path, or "
            f"edit {REFERENCE_FILE} to point at a copy of it.")
    config = PeftConfig.from_peft_type(**json.loads(files["adapter_config.json"]))
    config.inference_mode = False
    pretrained = PretrainedModel(pretrained.path, pretrained.auto_class, peft_config=config,
                                 **pretrained.from_pretrained_kwargs)
    model = pretrained.driver_model(int(reference["seed"]))
    result = set_peft_model_state_dict(model, load_safetensors(files["adapter_model.safetensors"]))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise InvalidArgumentError(f"The saved adapter holds tensors the model has no place "
                                   f"for: {unexpected[:5]}.")
    return model


def merged_model(model: nn.Module) -> nn.Module:
    """The whole model with the adapters merged into the base (``merge_and_unload``): a plain
    ``transformers`` model on the driver's CPU, the base read from its path. It holds every
    weight (the base's size in the driver's memory)."""
    pretrained, seed = _origin(model, "A merged model")
    full = pretrained.standalone_model(seed)
    values = dict(trainable_parameters(model))
    with torch.no_grad():
        for name, p in full.named_parameters():
            if name in values:
                p.copy_(values[name])
    return full.merge_and_unload()
