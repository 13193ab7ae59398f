"""Checks of user-given values, with one message template for the whole library.

Every argument of the engine, every trigger and every Param of the DataFrame stages is checked
with these helpers, so every message reads the same:
``The 'x' argument of Y must be <what>. Got <value> instead.`` (``Param`` instead of
``argument`` for Spark ML Params). numpy integers are accepted wherever an int is.

Example::

    batch_size = check_positive_int("batch_size", "DistriOptimizer", batch_size)
    raise argument_error("allreduce", "DistriOptimizer", "'auto', 'shuffle' or 'driver'", value)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["argument_error", "is_int", "check_type", "check_int", "check_positive_int",
           "check_choice"]


def _shown(value: Any) -> str:
    if isinstance(value, (bool, int, float, str, np.integer, np.floating)) or value is None:
        text = repr(value.item() if isinstance(value, np.generic) else value)
    else:
        text = f"{type(value).__name__} {value!r}"
    return text if len(text) <= 200 else text[:200] + "..."


def argument_error(name: str, owner: str, expected: str, got: Any,
                   kind: str = "argument") -> InvalidArgumentError:
    """The one message template: "The 'name' <kind> of owner must be expected. Got ... instead."."""
    return InvalidArgumentError(f"The '{name}' {kind} of {owner} must be {expected}. "
                                f"Got {_shown(got)} instead.")


def is_int(value: Any) -> bool:
    """True for Python and numpy integers, False for bools."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_type(name: str, owner: str, value: Any, types: Any, expected: str,
               kind: str = "argument") -> Any:
    """``value`` if it is an instance of ``types``, else the standard error."""
    if not isinstance(value, types):
        raise argument_error(name, owner, expected, value, kind)
    return value


def check_int(name: str, owner: str, value: Any, minimum: int | None = None,
              kind: str = "argument") -> int:
    """``value`` as a Python int (numpy ints accepted), optionally at least ``minimum``."""
    if not is_int(value) or (minimum is not None and value < minimum):
        expected = "an int" if minimum is None else f"an int >= {minimum}"
        raise argument_error(name, owner, expected, value, kind)
    return int(value)


def check_positive_int(name: str, owner: str, value: Any, allow_none: bool = False,
                       kind: str = "argument") -> Any:
    """``value`` as a positive Python int (or None when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if not is_int(value) or value <= 0:
        raise argument_error(name, owner, "a positive int" + (" or None" if allow_none else ""),
                             value, kind)
    return int(value)


def check_choice(name: str, owner: str, value: Any, choices: Sequence[Any],
                 kind: str = "argument") -> Any:
    """``value`` if it is one of ``choices``."""
    if not any(value == c and type(value) is type(c) for c in choices):
        shown = ", ".join(repr(c) for c in choices[:-1])
        expected = f"{shown} or {choices[-1]!r}" if len(choices) > 1 else repr(choices[0])
        raise argument_error(name, owner, expected, value, kind)
    return value
