"""JSON Lines codec: one record per line, UTF-8, no NaN literals.

JSON has no NaN or infinity, and ``jq`` rejects the ``NaN`` that Python's json
module writes, so non-finite floats travel as the strings ``"nan"``, ``"inf"``
and ``"-inf"``; :func:`decode` turns them back into floats in step and eval
records (the only kinds whose values are user metrics).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import orjson

from tuiwatch.ledger.records import Decoded, Record

_NONFINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_METRIC_KINDS = ("step", "eval")
_CONTAINERS = frozenset((dict, list, tuple))
_MAX_TEXT = 200  # a value written as its text: at most this many characters of it


class DecodeError(ValueError):
    """A line that is not one JSON object."""


def _finite_or_text(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def _int_or_text(value: int) -> int | str:
    return value if -(2**63) <= value < 2**64 else str(value)  # orjson writes 64-bit integers only


def _replace_nonfinite(obj: Any) -> Any:
    """``obj`` with its non-finite floats as text, and what orjson refuses outright (an int past 64 bits, a key
    that is not a string) made writable."""
    if isinstance(obj, float):
        return _finite_or_text(obj)
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): _replace_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_replace_nonfinite(v) for v in obj]
    if type(obj) is int:
        return _int_or_text(obj)
    return obj


def _has_nonfinite(obj: Any) -> bool:
    # For a record whose line has more nulls than Nones (encode): plain loops and exact type tests first (x - x is
    # 0.0 for a finite float, nan otherwise), and a list of numbers (batch ids, lr per group) summed in one C loop.
    # 5 µs a step record where any() over generators took 37 (bench/publisher_changes.py).
    t = type(obj)
    if t is float:
        return bool(obj - obj != 0.0)
    if t is dict:
        return _any_nonfinite(obj.values())
    if t is list or t is tuple:
        if obj and type(obj[0]) in _CONTAINERS:  # a batch's shapes, say: sum() would raise at once
            return _any_nonfinite(obj)
        try:
            total = sum(obj)
        except TypeError:  # not all numbers: look at each
            return _any_nonfinite(obj)
        return type(total) is float and total - total != 0.0 and _any_nonfinite(obj)  # a sum may overflow alone
    return False


def _any_nonfinite(values: Iterable[Any]) -> bool:
    for v in values:
        t = type(v)
        if t is float:
            if v - v != 0.0:
                return True
        elif (t is dict or t is list or t is tuple) and _has_nonfinite(v):
            return True
    return False


def _nones(record: Record) -> int:
    """The Nones of ``record`` and of its ``finite`` object: the nulls its line must hold."""
    # A loop of identity tests: list.count(None) compares each float with None richly (870 ns a step record, 509).
    count = 0
    for v in record.values():
        if v is None:
            count += 1
    finite = record.get("finite")
    if type(finite) is dict:
        for v in finite.values():
            if v is None:
                count += 1
    return count


def _plain(value: Any) -> Any:
    """A value orjson cannot write, as one it can (orjson calls this for those only, so the usual record pays
    nothing): numpy's scalars (a custom sampler's ids are numpy ints) and any other number as a plain one,
    anything else as its text. One odd value in a record must not cost the records written with it."""
    if getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "shape", None) == ():
        return bool(value)  # numpy's bool (a config flag, a metric's verdict), which is no number to Python
    if isinstance(value, numbers.Integral):
        return _int_or_text(int(value))
    if isinstance(value, numbers.Real):
        return _finite_or_text(float(value))
    return str(value)[:_MAX_TEXT]


def encode(record: Record) -> bytes:
    """One record as one line of bytes, newline included."""
    # orjson silently writes NaN and inf as null, which would erase the very value a user needs at 2 a.m. A line
    # with no more "null" than the record's counted Nones holds none of them (every None and every non-finite
    # float is one null; text can only add more); anything else is scanned (1 µs a step record where the scan of
    # every record took 2.5).
    try:
        data = orjson.dumps(record, default=_plain, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # what orjson refuses before asking _plain (an int past 64 bits)
        return orjson.dumps(_replace_nonfinite(record), default=_plain, option=orjson.OPT_APPEND_NEWLINE)
    if data.count(b"null") == _nones(record) or not _has_nonfinite(record):
        return data
    return orjson.dumps(_replace_nonfinite(record), default=_plain, option=orjson.OPT_APPEND_NEWLINE)


# Lists of lists deeper than this are not a metric: a hostile line of 600 nested lists raised RecursionError
# (on the publisher's thread, and in report) before this limit.
MAX_DEPTH = 32


def _restore_nonfinite(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _NONFINITE_TEXT.get(value, value)
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            raise DecodeError(f"lists nested deeper than {MAX_DEPTH}")
        return [_restore_nonfinite(v, depth + 1) for v in value]
    return value


def decode(line: bytes | str) -> Decoded:
    """Parse one line into a record; raise :class:`DecodeError` if it is not a JSON object."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise DecodeError(f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("kind") in _METRIC_KINDS:
        for key, value in obj.items():
            if isinstance(value, str | list) and key not in ("kind", "batch_ids", "batch_shape"):
                obj[key] = _restore_nonfinite(value)
    return obj
