"""Reading one field of a record: the one place that decides what counts as a number.

A ledger may come from anywhere (another version, another tool, a fuzzer), so
every reader goes through these instead of trusting a field's type. ``bool``
is never a number here, although Python says it is an ``int``.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard


def is_number(value: Any) -> TypeGuard[int | float]:
    """An ``int`` or a ``float`` (NaN and infinities included), never a ``bool``."""
    return type(value) is float or type(value) is int


def is_finite(value: Any) -> TypeGuard[int | float]:
    """A number that is neither NaN nor infinite."""
    return is_number(value) and math.isfinite(value)


def num(value: Any) -> float | None:
    """The field as a float, or None when it is missing or not a number."""
    # Inlined type tests: the rules call this ~17 times a step record.
    t = type(value)
    return value if t is float else float(value) if t is int else None


def finite(value: Any) -> float | None:
    """The field as a finite float, or None (missing, not a number, NaN, ±inf)."""
    return float(value) if is_finite(value) else None


def integer(value: Any) -> int | None:
    """The field as an int, or None (a float, even a whole one, is not a step count)."""
    return value if type(value) is int else None
