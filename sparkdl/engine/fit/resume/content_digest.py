"""A deterministic digest of what a Python object computes with (driver side).

The fit identity (:mod:`sparkdl.engine.fit.resume.fit_identity`) must be the same for the same
fit in another Python process (a restarted driver) and differ whenever anything that decides the
result differs. So objects are hashed by their content, never by ``id()``, ``hash()`` or a
``repr`` holding a memory address:

* numbers, strings, bytes, ``None``: their value and type;
* tensors and numpy arrays: dtype, shape and bytes (and ``requires_grad``: a frozen layer
  trains differently); torch and numpy generators: their state; a weak reference: its referent;
* lists, tuples, dicts and sets: their items (dicts and sets in a sorted order);
* functions: their code (bytecode, constants, names; not file names or line numbers), default
  arguments, closure values and the module-level values they name (functions and classes of
  installed libraries and the standard library by module and name, as their code is fixed by
  what is installed, :mod:`sparkdl.engine.fit.resume.installed_code`; the attributes the code
  names of the user's own modules, ``cfg.LR``); a closure or module-level value the code only reads
  attributes from (``args.decay`` of an argparse Namespace) by its class and those attributes;
  a method of a module's hidden global generator (``random.random``, ``numpy.random.rand``)
  by its name, never the generator's state; ``functools.partial`` and bound methods by what
  they hold;
* classes of installed libraries by module, name and their distribution's version; the user's
  classes (and editable or unowned installs) also by their methods' code and class-level
  constants;
* ``nn.Module``: its class, attributes, hooks, parameters and buffers, submodules; a TorchScript
  module by its code and state; a ``torch.compile``'d one by the module it compiles; a
  pretrained model's driver copy (:class:`sparkdl.adapters.PretrainedModel`) by its base's
  files' content identity (:func:`sparkdl.storage.pretrained_files.base_identity`), its
  settings and seed, and its trainable parameters;
* torch optimizers, wherever they are reached from (a scheduler holds its optimizer): their
  class only (the fit identity hashes the optimizer's settings and state itself);
* loggers by their name (where a step logs does not change what it computes); paths by their
  text; pandas objects by their content (labels, dtypes, a stable hash of each row), not the
  caches a read leaves on them;
* any other object: its class and its attributes (``__dict__`` and ``__slots__``); one without
  attributes (a C object: a date, a deque, a regex) by what pickle would save of it; or what
  ``__sparkdl_identity__()`` returns when the class defines it.

Nothing depends on the process: not on ``PYTHONHASHSEED`` (tests/identity_battery_job.py
hashes a battery of kinds in two processes), not on a global generator's state.

What has no such content (a lock, a socket, a Spark session: objects without attributes that
cannot be pickled either) raises :class:`UnidentifiableError` naming where it was reached; the
caller decides what an explicit fit identity replaces
(:mod:`sparkdl.engine.fit.resume.fit_identity`: the whole argument that reached it).

An object reached twice (a model that a bound-method step also holds, a cycle) is walked once
and referred to by the order of its first visit after that.

Example::

    content_digest(lambda e: 0.99 ** e, "lr_lambda") != content_digest(lambda e: 0.01 ** e, "x")
    content_digest(torch.nn.HuberLoss(delta=2.0), "criterion")    # delta counts
"""

from __future__ import annotations

import copyreg
import enum
import functools
import hashlib
import logging
import pathlib
import random
import types
import weakref
from typing import Any

import numpy as np
import torch

from ....adapters.pretrained import pretrained_origin, trainable_parameters
from ....errors import UnidentifiableError
from .code_reads import attribute_reads, global_generator_method
from .installed_code import library_version
from .value_contents import (is_pandas, pandas_content, script_code, tensor_bytes,
                             tensor_header)

__all__ = ["content_digest", "UnidentifiableError", "is_library_code"]


def is_library_code(module_name: str) -> bool:
    """Whether ``module_name`` belongs to the standard library or an installed (non-editable)
    distribution: its code is fixed by what is installed, so its name and version identify it
    (:mod:`sparkdl.engine.fit.resume.installed_code`)."""
    return library_version(module_name) is not None


_MODULE_MAPS_BY_HANDLE = ("hooks", "hooks_with_kwargs", "hooks_always_called")


_WHOLE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
          functools.partial, torch.nn.Module, torch.Tensor, np.ndarray, np.generic, list, tuple,
          dict, set, frozenset, str, bytes, int, float, complex, enum.Enum, weakref.ref,
          torch.Generator, np.random.Generator, random.Random, torch.optim.Optimizer,
          logging.Logger, pathlib.PurePath)


def _narrowable(value: Any) -> bool:
    """A plain object with attributes (a config, an argparse Namespace), which a function can
    be identified by the attributes it reads from."""
    return (value is not None and not isinstance(value, _WHOLE) and hasattr(value, "__dict__")
            and getattr(type(value), "__sparkdl_identity__", None) is None
            and not is_pandas(value))


def _standalone(value: Any, path: str) -> str:
    """The digest of ``value`` on its own: what dict keys and set items are ordered by (never
    their ``repr``, which can hold memory addresses)."""
    walker = _Walker()
    walker.walk(value, path)
    return walker.digest.hexdigest()


class _Walker:
    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.seen: dict[int, int] = {}      # id -> order of first visit (shared objects, cycles)
        self.alive: list[Any] = []          # keeps what was visited alive: ids stay unique

    def put(self, tag: str, data: Any = b"") -> None:
        """Feed ``tag`` and ``data`` (text, bytes or a contiguous buffer: no copy is made)."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        self.digest.update(f"{tag}:{memoryview(data).nbytes}:".encode())
        self.digest.update(data)

    def refuse(self, value: Any, path: str, why: str) -> None:
        raise UnidentifiableError(
            f"{path} ({type(value).__module__}.{type(value).__qualname__}) {why}, so sparkdl "
            "cannot tell whether another fit uses the same one, and checkpoints need to know "
            "(a checkpoint is resumed only by the fit that wrote it). Give the fit an explicit "
            "identity that stands for it: DistriOptimizer.set_fit_identity('name-v1') or the "
            "estimators' fitIdentity Param; or define __sparkdl_identity__() on its class, "
            "returning the values that decide what it computes.")

    # ------------------------------------------------------------------------------ walking
    def walk(self, value: Any, path: str) -> None:
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            self.put(type(value).__name__, repr(value))
            return
        if isinstance(value, (torch.dtype, torch.device, torch.Size, range, slice,
                              type(Ellipsis), type(NotImplemented))):
            self.put(type(value).__name__, repr(value))
            return
        if isinstance(value, enum.Enum):
            self.put("enum", f"{type(value).__module__}.{type(value).__qualname__}.{value.name}")
            return
        if isinstance(value, types.ModuleType):
            self.put("module", value.__name__)
            return
        key = id(value)
        if key in self.seen:                # walked already (shared, or a cycle): by order
            self.put("seen", str(self.seen[key]))
            return
        self.seen[key] = len(self.seen)
        self.alive.append(value)
        self._walk_object(value, path)

    def _walk_object(self, value: Any, path: str) -> None:
        if isinstance(value, torch.nn.parameter.UninitializedTensorMixin):
            self.put("uninitialized", f"{type(value).__name__}{value.requires_grad}")
            return                           # a lazy module's: drawn at its first forward
        if isinstance(value, torch.Tensor):
            self.put("tensor", tensor_header(value))
            self.put("bytes", tensor_bytes(value))
            return
        if isinstance(value, np.ndarray):
            self.put("ndarray", f"{value.dtype.str}{list(value.shape)}")
            self.put("bytes", np.ascontiguousarray(value).view(np.uint8).reshape(-1)
                     if value.dtype != object and value.size else b"")
            if value.dtype == object:
                for i, item in enumerate(value.ravel()):
                    self.walk(item, f"{path}[{i}]")
            return
        if isinstance(value, np.generic):
            self.put("numpy", f"{value.dtype.str}:{value.item()!r}")
            return
        if isinstance(value, torch.Generator):
            self.walk(value.get_state(), f"{path}.get_state()")
            return
        if isinstance(value, np.random.Generator):
            self.walk(value.bit_generator.state, f"{path}.bit_generator.state")
            return
        if isinstance(value, (list, tuple)):
            self.put(type(value).__name__, str(len(value)))
            for i, item in enumerate(value):
                self.walk(item, f"{path}[{i}]")
            return
        if isinstance(value, dict):
            self.put("dict", str(len(value)))
            for digest, k, v in sorted(((_standalone(k, f"{path} key"), k, v)
                                        for k, v in value.items()), key=lambda e: e[0]):
                self.put("key", digest)
                self.walk(v, f"{path}[{k!r}]")
            return
        if isinstance(value, (set, frozenset)):
            self.put("set", str(len(value)))
            for digest in sorted(_standalone(item, f"{path} item") for item in value):
                self.put("item", digest)
            return
        if isinstance(value, weakref.ref):
            referent = value()
            if referent is None:
                self.put("dead weakref")
            else:
                self.walk(referent, f"{path}()")
            return
        if isinstance(value, torch.jit.ScriptModule):
            self.put("script module", type(value).__qualname__)
            code = script_code(value)
            self.put(*(("code", code) if code is not None else ("no code",)))
            self.walk(dict(value.state_dict()), f"{path}.state_dict()")
            self.walk(dict(value.named_children()), f"{path} children")
            return
        if type(value).__name__ == "OptimizedModule" and hasattr(value, "_orig_mod"):
            self.put("compiled")             # torch.compile: what it compiles
            self.walk(value._orig_mod, f"{path}._orig_mod")
            return
        rng_method = global_generator_method(value)
        if rng_method is not None:        # what it names, never the hidden generator's state
            self.put("global generator method", rng_method)
            return
        if isinstance(value, functools.partial):
            self.put("partial")
            self.walk(value.func, f"{path}.func")
            self.walk(value.args, f"{path}.args")
            self.walk(value.keywords, f"{path}.keywords")
            return
        if isinstance(value, types.MethodType):
            self.put("method")
            self.walk(value.__func__, f"{path}.__func__")
            self.walk(value.__self__, f"{path}.__self__")
            return
        if isinstance(value, types.FunctionType):
            self._function(value, path)
            return
        if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType,
                              types.WrapperDescriptorType, types.MethodDescriptorType)):
            owner = getattr(value, "__self__", None)
            self.put("builtin", f"{getattr(value, '__module__', None)}."
                                f"{getattr(value, '__qualname__', value.__name__)}")
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.walk(owner, f"{path}.__self__")
            return
        if isinstance(value, type):
            self._class(value, path)
            return
        if isinstance(value, logging.Logger):    # where a step logs to, not what it computes
            self.put("logger", value.name)
            return
        if isinstance(value, random.Random):
            self.walk(value.getstate(), f"{path}.getstate()")
            return
        if isinstance(value, torch.optim.Optimizer):
            self.put("optimizer", type(value).__qualname__)
            return
        identity = getattr(type(value), "__sparkdl_identity__", None)
        if identity is not None:
            self._class(type(value), path)
            self.walk(identity(value), f"{path}.__sparkdl_identity__()")
            return
        if isinstance(value, torch.nn.Module):
            origin = pretrained_origin(value)
            if origin is not None:     # its base by the files' content, never read whole
                self.put("pretrained", str(origin[1]))
                self.walk(origin[0], f"{path} (pretrained)")
                self.walk(dict(trainable_parameters(value)), f"{path} trainable")
                return
            self._module(value, path)
            return
        if isinstance(value, pathlib.PurePath):  # not its cached hash (PYTHONHASHSEED)
            self.put("path", f"{type(value).__qualname__}:{value}")
            return
        if is_pandas(value):                     # by content, not its caches
            self.put("pandas", f"{type(value).__module__}.{type(value).__qualname__}")
            self.walk(pandas_content(value), path)
            return
        self._instance(value, path)

    def _class(self, cls: type, path: str) -> None:
        module = getattr(cls, "__module__", "") or ""
        self.put("class", f"{module}.{cls.__qualname__}")
        if is_library_code(module):
            self.put("version", library_version(module) or "")
            return
        for base in cls.__mro__:           # user code: the methods' code counts
            if is_library_code(getattr(base, "__module__", "") or "") or base is object:
                continue
            for name, member in sorted(vars(base).items()):
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                if isinstance(member, types.FunctionType):
                    self.put("member", name)
                    self._function(member, f"{base.__qualname__}.{name}")
                elif not name.startswith("__") and isinstance(
                        member, (bool, int, float, str, tuple, list, dict, set, frozenset,
                                 type(None), torch.Tensor, np.ndarray)):
                    self.put("member", name)          # class-level constants
                    self.walk(member, f"{base.__qualname__}.{name}")

    def _function(self, fn: types.FunctionType, path: str) -> None:
        module = fn.__module__ or ""
        self.put("function", f"{module}.{fn.__qualname__}")
        reads: dict[str, frozenset[str] | None] = {}
        if is_library_code(module):
            self.put("version", library_version(module) or "")
        else:
            reads = attribute_reads(fn.__code__)
            self._code(fn.__code__, fn, path, reads)
        self.walk(fn.__defaults__, f"{path} defaults")
        self.walk(fn.__kwdefaults__, f"{path} keyword defaults")
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                content = cell.cell_contents
            except ValueError:             # an empty cell
                self.put("empty cell", name)
                continue
            self.put("cell", name)
            self._read_value(content, reads.get(name), f"{path} closure value {name!r}")

    def _read_value(self, value: Any, attributes: frozenset[str] | None, path: str) -> None:
        """A closure or global value: only the ``attributes`` the function reads from it when
        that is all it does with a plain object (``args.decay`` of a whole argparse
        Namespace), else all of it."""
        if not attributes or not _narrowable(value):
            self.walk(value, path)
            return
        self.put("attributes read", " ".join(sorted(attributes)))
        self._class(type(value), path)
        for attribute in sorted(attributes):
            try:
                item = getattr(value, attribute)
            except AttributeError:
                self.put("missing attribute", attribute)
                continue
            self.put("attribute", attribute)
            self.walk(item, f"{path}.{attribute}")

    def _code(self, code: types.CodeType, fn: types.FunctionType, path: str,
              reads: dict[str, frozenset[str] | None]) -> None:
        self.put("code", code.co_code)
        self.put("names", " ".join(code.co_names))
        self.put("args", f"{code.co_argcount}/{code.co_kwonlyargcount}/{code.co_flags}")
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._code(const, fn, path, reads)
            else:
                self.walk(const, f"{path} constant")
        module_globals = fn.__globals__
        for name in code.co_names:         # the module-level values it reads
            if name in module_globals and not name.startswith("__"):
                value = module_globals[name]
                self.put("global", name)
                self._read_value(value, reads.get(name), f"{path} global {name!r}")
                if isinstance(value, types.ModuleType) and not is_library_code(value.__name__):
                    for attribute in code.co_names:    # cfg.LR of the user's own module
                        if not attribute.startswith("__") and hasattr(value, attribute):
                            self.put("module attribute", attribute)
                            self.walk(getattr(value, attribute),
                                      f"{path} global {name}.{attribute}")

    def _module(self, module: torch.nn.Module, path: str) -> None:
        self._class(type(module), path)
        for name, value in sorted(vars(module).items()):
            if name in ("_parameters", "_buffers", "_modules"):
                self.put("members", name)
                self.put("count", str(len(value)))
                for member, item in value.items():
                    self.put("name", member)
                    self.walk(item, f"{path}.{member}")
                continue
            if name.endswith(_MODULE_MAPS_BY_HANDLE) and isinstance(value, dict):
                if value:                  # keyed by handles (a process-wide counter): in order
                    self.put("hooks", name)
                    self.walk(list(value.values()), f"{path}.{name}")
                continue
            self.put("attribute", name)
            self.walk(value, f"{path}.{name}")

    def _instance(self, value: Any, path: str) -> None:
        cls = type(value)
        attributes: dict[str, Any] = {}
        if hasattr(value, "__dict__"):
            attributes.update(vars(value))
        for klass in cls.__mro__:
            for slot in getattr(klass, "__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                    attributes[slot] = getattr(value, slot)
        if not attributes and not hasattr(value, "__dict__"):
            # a C object (a date, a deque, a lock): its content is what pickle would save
            try:                           # as pickle asks: copyreg's table first (a regex)
                reducer = copyreg.dispatch_table.get(cls)
                reduced = reducer(value) if reducer is not None else value.__reduce_ex__(4)
            except Exception:              # noqa: BLE001 - what it raises does not matter
                reduced = None
            if not isinstance(reduced, tuple):
                self.refuse(value, path, "has no content sparkdl can read (no attributes, "
                                         "and it cannot be pickled)")
                return
            self._class(cls, path)
            self.walk(list(reduced[1:]), f"{path} (as pickled)")
            return
        self._class(cls, path)
        for name, item in sorted(attributes.items()):
            self.put("attribute", name)
            self.walk(item, f"{path}.{name}")


def content_digest(value: Any, what: str) -> str:
    """The hex SHA-256 of ``value``'s content (see the module docstring); ``what`` names it in
    errors."""
    walker = _Walker()
    walker.walk(value, what)
    return walker.digest.hexdigest()
