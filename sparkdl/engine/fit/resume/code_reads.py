"""What a function's code reads, as far as its bytecode says (driver side).

:mod:`sparkdl.engine.fit.resume.content_digest` identifies a function by what it computes
with. Two facts about the values it names keep that identity to what decides its result:

* :func:`attribute_reads`: for each global or closure name, the attributes the code reads from
  it, when that is all it does (``args.decay``): the rest of the object (``args.epochs``) does
  not decide what the function computes;
* :func:`global_generator_method`: a method of a module's hidden global generator
  (``from random import random``) is named by module and name; the generator's state changes
  from process to process and from call to call.

Example::

    attribute_reads((lambda e: args.decay ** e).__code__)    # {"args": frozenset({"decay"})}
    global_generator_method(random.random)                   # "random.random"
"""

from __future__ import annotations

import dis
import functools
import random
import types
from typing import Any

import numpy as np

__all__ = ["attribute_reads", "global_generator_method"]


_NAME_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF")
_NAME_WRITES = ("STORE_GLOBAL", "STORE_DEREF", "STORE_NAME", "DELETE_GLOBAL", "DELETE_DEREF",
                "DELETE_NAME")


@functools.lru_cache(maxsize=1024)
def attribute_reads(code: types.CodeType) -> dict[str, frozenset[str] | None]:
    """For each global or closure name ``code`` (with the code nested in it) loads: the
    attributes it reads from it, when every load is followed by an attribute read
    (``args.decay``), else None (the value itself is used)."""
    reads: dict[str, set[str] | None] = {}

    def visit(c: types.CodeType) -> None:
        instructions = list(dis.get_instructions(c))
        for i, ins in enumerate(instructions):
            if ins.opname in _NAME_WRITES:
                reads[ins.argval] = None
            elif ins.opname in _NAME_LOADS:
                after = instructions[i + 1] if i + 1 < len(instructions) else None
                known = reads.get(ins.argval, set())
                if after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD") and \
                        known is not None and isinstance(after.argval, str):
                    reads[ins.argval] = known | {after.argval}
                else:
                    reads[ins.argval] = None
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                visit(const)

    visit(code)
    return {k: None if v is None else frozenset(v) for k, v in reads.items()}


def global_generator_method(value: Any) -> str | None:
    """``"random.gauss"`` for a method of a module's hidden global generator (``random``'s,
    numpy's legacy ``np.random.rand``...): such a function is named by what it names, since the
    generator's state changes from process to process and call to call."""
    owner = getattr(value, "__self__", None)
    if owner is None or isinstance(owner, (type, types.ModuleType)):
        return None
    name = getattr(value, "__name__", None)
    if owner is random._inst:                                  # type: ignore[attr-defined]
        return f"random.{name}"
    if owner is getattr(np.random.mtrand, "_rand", None):
        return f"numpy.random.{name}"
    return None
