"""A pretrained Hugging Face model given by where it is stored, fine-tuned with its base loaded
where it is used (LoRA and the other ``peft`` methods included).

:class:`PretrainedModel` names a directory that ``save_pretrained`` wrote (a local path, a
``file:`` URI, or any URI ``pyarrow.fs`` reaches: ``s3://``, ``hdfs://``), a ``transformers``
auto class, and optionally a ``peft`` config. It is accepted wherever a model is
(:class:`sparkdl.DistriOptimizer`, :class:`sparkdl.NNEstimator` / :class:`sparkdl.NNClassifier`,
passes and local rounds); ``optimizer=`` is then a callable ``params -> Optimizer`` over the
trainable parameters, which exist only once the model is built.

Where each part lives:

* **The driver** builds the model's structure from its ``config.json`` with the frozen
  weights on the meta device (no memory), applies ``peft.get_peft_model`` after
  ``torch.manual_seed(seed)`` (the fit's seed), and holds the trainable parameters (LoRA: the
  adapters) and their optimizer state. It reads from the base's files only the tensors it holds
  besides the adapters: base modules that ``modules_to_save`` trains (a classification head)
  and persistent buffers, each by its byte range (:mod:`sparkdl.storage.pretrained_files`).
* **The executors** load the base themselves (``from_pretrained``, from a copy on their local
  disk when the path is remote), keep it in the Python worker between iterations and across the
  fits of a pass (:data:`_BASES`; :func:`base_loads` counts the loads), and give each fit its
  own ``peft`` model over the shared frozen tensors, built with the same seed: its adapters are
  bitwise the driver's.
* **The wire** carries the trainable parameters and the buffers (the flat layout holds only
  ``requires_grad`` parameters): the pickled model a fit ships is this description plus the
  trainable tensors (:class:`ShippedPretrained`), never the base.

Adapter initialisations that read the base's weights (``init_lora_weights`` = ``"pissa"``,
``"olora"``, ``"loftq"``, ``"corda"``, ``"eva"``, and DoRA's magnitudes) cannot be computed on
a driver that does not hold them: they are refused. The base's files must hold every weight
of the model (``save_pretrained`` of the model with its head): a weight ``from_pretrained``
would initialise at random is an error, as each executor would draw its own.

Example::

    from peft import LoraConfig
    from sparkdl.adapters import PretrainedModel, huggingface_step
    base = PretrainedModel("hdfs:///models/tiny-llama", "AutoModelForCausalLM",
                           peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trained = DistriOptimizer(base, rdd, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
                              batch_size=32, training_step=huggingface_step()).optimize()
    trained.save_pretrained("/models/tiny-llama-lora")      # the adapter
"""

from __future__ import annotations

import copy
import json
import logging
import os
import posixpath
import tempfile
from typing import Any, Callable

import torch
from torch import nn

from ..errors import InvalidArgumentError
from ..executor.worker_cache import WorkerCache

__all__ = ["PretrainedModel", "ShippedPretrained", "pretrained_origin", "shipped_model",
           "trainable_parameters", "base_loads", "has_meta_weights"]

log = logging.getLogger("sparkdl")

ORIGIN_ATTRIBUTE = "sparkdl_pretrained"
"""The attribute of a driver model built by :meth:`PretrainedModel.driver_model`: its
``(PretrainedModel, seed)``."""

_BASE_INITS = ("pissa", "olora", "loftq", "corda", "eva")
"""``init_lora_weights`` values that read the base's weights."""

_MODEL_KEYWORDS = ("dtype", "torch_dtype", "attn_implementation")
"""``from_pretrained`` keywords that are the model's, not its config's."""

_REFUSED_KEYWORDS = ("device_map", "quantization_config", "low_cpu_mem_usage", "tp_plan")
"""``from_pretrained`` keywords that decide where the weights go: the tasks decide that."""

_BASES: WorkerCache[nn.Module] = WorkerCache(capacity=2, freeze=True)
_LOADS = [0]


def base_loads() -> int:
    """How many bases this Python worker loaded from storage (a cached base is not counted
    again)."""
    return _LOADS[0]


class PretrainedModel:
    """A model given by where it is stored (see the module docstring).

    Args:
        path: the directory ``save_pretrained`` wrote (``config.json`` and ``.safetensors``
            weights): a local path, ``file:`` URI or a URI of ``pyarrow.fs`` (``s3://``,
            ``hdfs://``); the same path must reach the same files from the driver and the
            executors.
        auto_class: a ``transformers`` auto class by name
            (``"AutoModelForSequenceClassification"``, ``"AutoModelForCausalLM"``, ...) or a
            class with ``from_pretrained`` and ``from_config``.
        peft_config: a ``peft`` config (``LoraConfig(...)``) applied after loading, with
            ``torch.manual_seed(seed)`` set right before ``peft.get_peft_model`` (the fit's
            seed); None: the whole model trains (its weights then do travel).
        **from_pretrained_kwargs: given to ``from_pretrained`` on the executors (``dtype``,
            ``attn_implementation``, config overrides such as ``num_labels``).

    Example::

        PretrainedModel("/models/tiny-bert", "AutoModelForSequenceClassification",
                        peft_config=LoraConfig(r=8, target_modules=["query", "value"],
                                               modules_to_save=["classifier"]))
    """

    def __init__(self, path: str, auto_class: str | type, peft_config: Any = None,
                 **from_pretrained_kwargs: Any) -> None:
        if not isinstance(path, str) or not path.strip():
            raise InvalidArgumentError(f"The 'path' of PretrainedModel must name the directory "
                                       f"save_pretrained wrote. Got {path!r} instead.")
        if not (isinstance(auto_class, str) and auto_class.strip()) and not (
                isinstance(auto_class, type) and hasattr(auto_class, "from_pretrained")):
            raise InvalidArgumentError(
                "The 'auto_class' of PretrainedModel must name a transformers auto class "
                "('AutoModelForSequenceClassification', 'AutoModelForCausalLM', ...) or be a "
                f"class with from_pretrained. Got {auto_class!r} instead.")
        refused = sorted(k for k in from_pretrained_kwargs if k in _REFUSED_KEYWORDS)
        if refused:
            raise InvalidArgumentError(
                f"PretrainedModel does not take {', '.join(refused)}: every task places its "
                "own copy of the base (device='auto' or 'cuda' of the fit), and the driver "
                "keeps only the structure.")
        if peft_config is not None:
            _check_peft_config(peft_config)
        self.path = path
        self.auto_class = auto_class
        self.peft_config = peft_config
        self.from_pretrained_kwargs = dict(from_pretrained_kwargs)

    def __repr__(self) -> str:
        name = self.auto_class if isinstance(self.auto_class, str) else self.auto_class.__name__
        peft = "" if self.peft_config is None else f", peft_config={type(self.peft_config).__name__}"
        return f"PretrainedModel({self.path!r}, {name!r}{peft})"

    # ------------------------------------------------------------------ shared by both sides
    def model_class(self) -> Any:
        """The auto class (or class) that loads the model."""
        if not isinstance(self.auto_class, str):
            return self.auto_class
        import transformers

        found = getattr(transformers, self.auto_class, None)
        if found is None or not hasattr(found, "from_pretrained"):
            raise InvalidArgumentError(
                f"PretrainedModel: transformers has no model class {self.auto_class!r}; name "
                "an auto class such as 'AutoModelForSequenceClassification' or "
                "'AutoModelForCausalLM'.")
        return found

    def _config(self, directory: str) -> tuple[Any, dict[str, Any]]:
        """The model's config (with the config overrides) and the keywords for the model."""
        from transformers import AutoConfig

        model_keywords = {k: v for k, v in self.from_pretrained_kwargs.items()
                          if k in _MODEL_KEYWORDS}
        overrides = {k: v for k, v in self.from_pretrained_kwargs.items()
                     if k not in _MODEL_KEYWORDS}
        config = AutoConfig.from_pretrained(directory, **overrides)
        dtype = model_keywords.pop("torch_dtype", None) or model_keywords.pop("dtype", None)
        if dtype is None or dtype == "auto":     # the checkpoint's own, on both sides
            dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model_keywords["dtype"] = dtype or torch.float32
        return config, model_keywords

    def _peft(self, model: nn.Module, seed: int) -> nn.Module:
        if self.peft_config is None:
            return model
        import peft

        from ..engine.fit.optim.rng_isolation import private_torch_rng

        with private_torch_rng(seed):
            return peft.get_peft_model(model, copy.deepcopy(self.peft_config))

    def identity(self) -> str:
        """The base's content identity (:func:`sparkdl.storage.pretrained_files.base_identity`)."""
        from ..storage.pretrained_files import base_identity

        return base_identity(self.path)

    def __sparkdl_identity__(self) -> dict[str, Any]:
        """What identifies this model in a fit's identity: the base's files by content, the
        class, the peft config and the keywords (not the path)."""
        name = self.auto_class if isinstance(self.auto_class, str) else \
            f"{self.auto_class.__module__}.{self.auto_class.__qualname__}"
        config = None if self.peft_config is None else self.peft_config.to_dict()
        return {"base": self.identity(), "auto_class": name,
                "peft_config": json.dumps(config, sort_keys=True, default=repr),
                "kwargs": repr(sorted(self.from_pretrained_kwargs.items()))}

    # ------------------------------------------------------------------ the driver's model
    def driver_model(self, seed: int = 0) -> nn.Module:
        """The model as the driver holds it: frozen weights on the meta device, trainable ones
        initialised as the executors initialise theirs (see the module docstring)."""
        from accelerate import init_empty_weights

        with tempfile.TemporaryDirectory() as scratch:
            _copy_config(self.path, scratch)
            config, keywords = self._config(scratch)
        with init_empty_weights(include_buffers=False):
            model = self.model_class().from_config(config, **keywords)
        _as_placeholders(model)
        model = self._peft(model, seed)
        _read_base_tensors(self, model)
        _frozen_to_meta(model)
        setattr(model, ORIGIN_ATTRIBUTE, (self, int(seed)))
        return model

    # ------------------------------------------------------------------ the executors' model
    def executor_model(self, seed: int = 0) -> nn.Module:
        """The model as a task holds it: this worker's cached base (loaded on first use), under
        a ``peft`` model of its own built with ``seed``."""
        from ..storage.pretrained_files import base_identity

        identity = base_identity(self.path)
        key = (identity, repr(self.auto_class), repr(sorted(self.from_pretrained_kwargs.items(),
                                                              key=lambda kv: kv[0])))
        base = _BASES.get_or_create(key, lambda: self._load_base(identity))
        shared = {id(p): p for p in base.parameters()}
        structure = copy.deepcopy(base, memo=dict(shared))
        if self.peft_config is None:       # the whole model trains: its own copy of the base
            _all_trainable(structure)
        model = self._peft(structure, seed)
        _unshare_trainable(model, shared)
        return model

    def standalone_model(self, seed: int = 0) -> nn.Module:
        """The model with a base of its own (loaded now, shared with nothing, every weight in
        this process's memory), under a ``peft`` model built with ``seed``: what merging the
        adapters into the base may modify."""
        from ..storage.pretrained_files import base_identity

        return self._peft(self._load_base(base_identity(self.path)), seed)

    def _load_base(self, identity: str) -> nn.Module:
        from ..storage.pretrained_files import local_copy

        directory = local_copy(self.path, identity)
        config, keywords = self._config(directory)
        model, info = self.model_class().from_pretrained(directory, config=config,
                                                         output_loading_info=True, **keywords)
        missing = sorted(info.get("missing_keys", ()))
        if missing:
            raise InvalidArgumentError(
                f"The pretrained model at {self.path!r} lacks the weights {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}: from_pretrained would initialise them "
                "at random on every executor differently. Save the model with every weight "
                "(build it, then save_pretrained) before fine-tuning it here.")
        for p in model.parameters():
            p.requires_grad_(False)
        _LOADS[0] += 1
        log.info("loaded the pretrained base %s (%s) in this worker", self.path, identity[:12])
        return model


class ShippedPretrained:
    """What a driver model of :class:`PretrainedModel` becomes when pickled: the description,
    the seed and the trainable parameters (themselves, so that an optimizer pickled with them
    keeps referring to them). Unpickling builds the executor's model around them."""

    def __init__(self, pretrained: PretrainedModel, seed: int,
                 trainable: dict[str, nn.Parameter], modes: list[bool]) -> None:
        self.pretrained, self.seed, self.trainable, self.modes = pretrained, seed, trainable, modes

    def __reduce__(self) -> tuple[Callable[..., nn.Module], tuple[Any, ...]]:
        return _executor_model, (self.pretrained, self.seed, self.trainable, self.modes)


def _executor_model(pretrained: PretrainedModel, seed: int, trainable: dict[str, nn.Parameter],
                    modes: list[bool]) -> nn.Module:
    model = pretrained.executor_model(seed)
    mine = dict(model.named_parameters())
    for name, value in trainable.items():
        own = mine.get(name)
        if own is None or own.shape != value.shape or own.dtype != value.dtype \
                or not own.requires_grad:
            raise InvalidArgumentError(
                f"The executor's build of {pretrained!r} has no trainable parameter {name!r} "
                f"{tuple(value.shape)} {value.dtype} as the driver's has: the base's files "
                "changed, or transformers / peft differ between the driver and the executors.")
        _set_parameter(model, name, value)
    for module, mode in zip(model.modules(), modes):
        module.training = mode
    return model


def shipped_model(model: Any) -> Any:
    """``model`` as it should be pickled for the tasks: a :class:`ShippedPretrained` for a
    driver model of :class:`PretrainedModel`, else ``model`` itself."""
    origin = pretrained_origin(model)
    if origin is None:
        return model
    pretrained, seed = origin
    return ShippedPretrained(pretrained, seed, dict(trainable_parameters(model)),
                             [m.training for m in model.modules()])


def pretrained_origin(model: Any) -> tuple[PretrainedModel, int] | None:
    """``(PretrainedModel, seed)`` of a driver model it built, else None."""
    origin = getattr(model, "__dict__", {}).get(ORIGIN_ATTRIBUTE)
    return origin if isinstance(origin, tuple) else None


def has_meta_weights(model: nn.Module) -> bool:
    """Whether some of ``model``'s weights are on the meta device (a pretrained model's frozen
    base, as the driver holds it)."""
    return any(p.is_meta for p in model.parameters())


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of the parameters that train, in ``named_parameters`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


# ---------------------------------------------------------------------- building helpers
def _check_peft_config(config: Any) -> None:
    try:
        from peft import PeftConfig
    except ImportError as exc:
        raise InvalidArgumentError("PretrainedModel(peft_config=...) needs peft: pip install "
                                   "'sparkdl-torch[peft]'.") from exc
    if not isinstance(config, PeftConfig):
        raise InvalidArgumentError(f"The 'peft_config' of PretrainedModel must be a peft config "
                                   f"such as LoraConfig(...). Got {type(config).__name__}.")
    init = getattr(config, "init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_BASE_INITS):
        raise InvalidArgumentError(
            f"PretrainedModel cannot use init_lora_weights={init!r}: it reads the base's weights, "
            "which the driver does not hold. Use the default (True) or 'gaussian'.")
    if getattr(config, "use_dora", False):
        raise InvalidArgumentError(
            "PretrainedModel cannot use use_dora=True: DoRA's magnitudes start from the base's "
            "weight norms, which the driver does not hold.")


def _copy_config(path: str, directory: str) -> None:
    """``path``'s config.json into ``directory`` (all the driver reads to know the structure)."""
    from ..storage.arrow_files import resolve

    system, root = resolve(path)
    try:
        with system.open_input_stream(posixpath.join(root, "config.json")) as src:
            data = src.read()
    except (FileNotFoundError, OSError) as exc:
        raise InvalidArgumentError(
            f"The pretrained model's path {path!r} has no config.json: give the directory "
            "that save_pretrained wrote.") from exc
    with open(os.path.join(directory, "config.json"), "wb") as out:
        out.write(data)


def _modules_of(model: nn.Module) -> list[nn.Module]:
    return list(model.modules())


def _replace_parameters(model: nn.Module, wanted: Callable[[nn.Parameter], bool],
                        make: Callable[[nn.Parameter], nn.Parameter]) -> None:
    """Every parameter of ``model`` that is ``wanted`` replaced by ``make(parameter)``, one
    replacement per parameter (tied parameters stay tied)."""
    made: dict[int, nn.Parameter] = {}
    for module in _modules_of(model):
        for name, p in list(module._parameters.items()):
            if p is None or not wanted(p):
                continue
            if id(p) not in made:
                made[id(p)] = make(p)
            module._parameters[name] = made[id(p)]


def _as_placeholders(model: nn.Module) -> None:
    """Meta parameters replaced by CPU tensors of one element broadcast to their shape (no
    memory), so that ``peft`` creates its adapters on the CPU, drawing the random numbers the
    executors draw; tied parameters stay tied."""
    _replace_parameters(model, lambda p: p.is_meta, lambda p: nn.Parameter(
        torch.zeros((), dtype=p.dtype).expand(p.shape), requires_grad=p.requires_grad))


def _frozen_to_meta(model: nn.Module) -> None:
    """Every parameter that does not train to the meta device (tied ones stay tied)."""
    _replace_parameters(model, lambda p: not p.requires_grad and not p.is_meta,
                        lambda p: nn.Parameter(torch.empty(p.shape, dtype=p.dtype,
                                                           device="meta"), requires_grad=False))


def _adapter_parameters(model: nn.Module) -> set[int]:
    """The parameters ``peft`` initialised itself (its tuner layers' adapters)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return set()
    found: set[int] = set()
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            for attribute in module.adapter_layer_names:
                layer = getattr(module, attribute, None)
                if isinstance(layer, nn.Module):
                    found.update(id(p) for p in layer.parameters())
    return found


def _base_key(name: str) -> str:
    """The base checkpoint's key of a ``peft`` model's parameter or buffer name."""
    parts = name.split(".")
    if parts[:2] == ["base_model", "model"]:
        parts = parts[2:]
    out: list[str] = []
    skip = 0
    for i, part in enumerate(parts):
        if skip:
            skip -= 1
            continue
        if part in ("modules_to_save", "original_module"):
            skip = 1 if part == "modules_to_save" else 0
            continue
        out.append(part)
    return ".".join(out)


def _read_base_tensors(pretrained: PretrainedModel, model: nn.Module) -> None:
    """Read from the base's files the tensors the driver holds that are the base's: trainable
    parameters ``peft`` did not initialise (``modules_to_save``, trained biases) and persistent
    buffers."""
    from ..storage.pretrained_files import read_tensors

    adapters = _adapter_parameters(model)
    wanted: dict[str, str] = {}
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in adapters:
            wanted[name] = _base_key(name)
    saved = set(model.state_dict())
    for name, _ in model.named_buffers():
        if name in saved:
            wanted[name] = _base_key(name)
    if not wanted:
        return
    found = read_tensors(pretrained.path, set(wanted.values()))
    missing = sorted(n for n, key in wanted.items()
                     if key not in found and n in dict(model.named_parameters()))
    if missing:
        raise InvalidArgumentError(
            f"The pretrained model at {pretrained.path!r} has no weight "
            f"{wanted[missing[0]]!r} in its .safetensors files for the trainable parameter "
            f"{missing[0]!r}: save the model with every weight (save_pretrained, safetensors).")
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    with torch.no_grad():
        for name, key in wanted.items():
            if key not in found:
                continue
            if name in params:
                p = params[name]
                _set_parameter(model, name, nn.Parameter(
                    found[key].to(p.dtype).reshape(p.shape).clone(), requires_grad=True))
            else:
                b = buffers[name]
                b.copy_(found[key].to(b.dtype).reshape(b.shape))


def _set_parameter(model: nn.Module, name: str, value: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module._parameters[leaf] = value


def _all_trainable(model: nn.Module) -> None:
    """Every parameter of ``model`` replaced by a trainable copy (tied ones stay tied): the
    cached base's own stay frozen and as loaded."""
    _replace_parameters(model, lambda p: True,
                        lambda p: nn.Parameter(p.detach().clone(), requires_grad=True))


def _unshare_trainable(model: nn.Module, shared: dict[int, nn.Parameter]) -> None:
    """A parameter of the cached base that this fit trains (a trained bias) becomes its own
    copy: the base's stays as loaded for the other fits."""
    for name, p in list(model.named_parameters()):
        if p.requires_grad and id(p) in shared:
            _set_parameter(model, name, nn.Parameter(p.detach().clone(), requires_grad=True))
