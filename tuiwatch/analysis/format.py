"""Numbers, sizes, durations and text from a run, made short and safe to show.

The one formatter: the viewer, ``report``, ``diff`` and ``ls`` all print
through it, so a value reads the same everywhere. Every function takes what a
record holds (anything, from a ledger written anywhere) and shows a value it
cannot format as ``-``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from tuiwatch.ledger.fields import finite
from tuiwatch.ledger.numbers import fit, number, quantity

__all__ = [
    "duration",
    "fit",
    "json_text",
    "number",
    "percent",
    "quantity",
    "safe",
    "seconds_short",
    "size",
    "size_of",
    "with_unit",
]

# C0 and C1 controls (ESC starts CSI/OSC sequences; 0x9b is a one-byte CSI), DEL,
# and the bidi overrides that can make text read differently from its bytes.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# What JSON leaves raw in a string that a terminal still obeys (C0 controls JSON escapes itself).
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def json_text(obj: Any, indent: bool = True) -> str:
    """``obj`` as JSON that is safe to print: C1 controls and bidi overrides in strings, which JSON allows raw
    and a terminal obeys (U+009B starts a CSI), are written as ``\\uXXXX`` escapes. NaN and inf become null."""
    option = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS if indent else orjson.OPT_NON_STR_KEYS
    try:
        text = orjson.dumps(obj, option=option, default=str).decode()
    except TypeError:  # an integer past 64 bits (a ledger may hold anything): written as its digits, quoted
        text = orjson.dumps(_big_ints_as_text(obj), option=option, default=str).decode()
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _big_ints_as_text(obj: Any) -> Any:
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**64:
        return str(obj)
    if isinstance(obj, dict):
        return {_big_ints_as_text(k): _big_ints_as_text(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_big_ints_as_text(v) for v in obj]
    return obj


def safe(text: object, limit: int = 200) -> str:
    """``text`` as plain, printable, one-line text of at most ``limit`` characters.

    Used for every string that comes from a run (metric names, messages,
    paths): control characters become ``�`` so that no escape sequence reaches
    the terminal, and callers render the result as literal text, never markup.
    """
    s = _UNSAFE.sub("\ufffd", str(text))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def size(n_bytes: Any) -> str:
    """Bytes as B, KiB, MiB, GiB, TiB."""
    n = finite(n_bytes)
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def size_of(used: Any, total: Any) -> str:
    """``31.4/80.0 GiB``: both in the total's unit."""
    u, t = finite(used), finite(total)
    if u is None or t is None or t <= 0:
        return f"{size(used)}/{size(total)}"
    value, unit = size(t).split(" ")
    return f"{u * float(value) / t:.1f}/{value} {unit}"


def duration(seconds: Any) -> str:
    """Seconds as 45s, 12m03s, 3h07m, 2d04h."""
    value = finite(seconds)
    if value is None or value < 0:
        return "-"
    s = int(value)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s < 1000 * 86400:
        return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
    return f"{number(value / 86400)}d"  # a clock from a ledger written anywhere: 1.7e308 s is "2e303d", not 300 digits


def seconds_short(seconds: Any) -> str:
    """A step time: 850µs, 12.3ms, 1.20s."""
    value = finite(seconds)
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f}µs"
    if value < 1:
        return f"{value * 1e3:.1f}ms"
    return f"{value:.2f}s"


def percent(value: Any) -> str:
    """``42%`` from a percentage (0-100), ``-`` for anything else."""
    v = finite(value)
    return "-" if v is None else f"{v:.0f}%"


def with_unit(value: Any, unit: str) -> str:
    """``71°C``, ``250W``; ``-°C`` when there is no reading."""
    v = finite(value)
    return f"-{unit}" if v is None else f"{v:.0f}{unit}"


def rules_text(rules: Any, note: Any) -> str | None:
    """A run record's ``rules`` as what differs from the defaults (every rule with its own: None), and
    ``rules_note``, why, where the run said."""
    parts: list[str] = []
    if isinstance(rules, list):
        parts.append("only " + ", ".join(str(r) for r in rules) if rules else "none")
    elif isinstance(rules, Mapping):
        off = [str(r) for r, v in rules.items() if v is False]
        tuned = [str(r) for r, v in rules.items() if isinstance(v, Mapping) and v]
        if off:
            parts.append("off: " + ", ".join(off))
        if tuned:
            parts.append("thresholds set: " + ", ".join(tuned))
    if note:
        parts.append(str(note))
    return "; ".join(parts) or None
