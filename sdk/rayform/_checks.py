"""Checks of the SDK's scalar arguments: one place, one wording.

Each check returns the value in its plain Python type (a numpy integer becomes an ``int``) or
raises :class:`~rayform.errors.InvalidArgumentError` naming the argument, the value and what is
allowed. ``bool`` is never an integer or a number here: ``horizon=True`` is a mistake.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TypeVar

from rayform.errors import InvalidArgumentError

__all__ = [
    "check_choice",
    "check_int",
    "check_non_negative_int",
    "check_positive_int",
    "check_positive_number",
    "is_int",
]

T = TypeVar("T", str, "str | None")


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (Python's or numpy's), not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: object) -> int:
    """``value`` as an ``int``; refused unless it is an integer."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name}={value!r}: use an integer")
    return int(value)


def check_positive_int(name: str, value: object) -> int:
    """``value`` as an ``int`` >= 1."""
    out = check_int(name, value)
    if out < 1:
        raise InvalidArgumentError(f"{name}={value!r}: use an integer >= 1")
    return out


def check_non_negative_int(name: str, value: object, zero: str = "") -> int:
    """``value`` as an ``int`` >= 0; ``zero`` says what 0 means (``"no threads"``)."""
    out = check_int(name, value)
    if out < 0:
        meaning = f"0 ({zero}) or a positive integer" if zero else "a non-negative integer"
        raise InvalidArgumentError(f"{name}={value!r}: use {meaning}")
    return out


def check_positive_number(name: str, value: object, example: str = "15", unit: str = "") -> float:
    """``value`` as a finite ``float`` > 0; ``unit`` (e.g. ``"Hz"``) is named in the error."""
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else 0
    if not math.isfinite(number) or number <= 0:
        what = f"a finite number > 0 ({unit})" if unit else "a finite number > 0"
        raise InvalidArgumentError(f"{name}={value!r}: use {what}, e.g. {example}")
    return number


def check_choice(name: str, value: T, allowed: Sequence[T]) -> T:
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise InvalidArgumentError(f"{name}={value!r}: use one of {', '.join(map(repr, allowed))}")
    return value
