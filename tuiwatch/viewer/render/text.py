"""Text from a run, made safe to show, and numbers made short."""

from __future__ import annotations

import math
import re

# C0 and C1 controls (ESC starts CSI/OSC sequences; 0x9b is a one-byte CSI), DEL,
# and the bidi overrides that can make text read differently from its bytes.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe(text: object, limit: int = 200) -> str:
    """``text`` as plain, printable, one-line text of at most ``limit`` characters.

    Used for every string that comes from a run (metric names, messages,
    paths): control characters become ``�`` so that no escape sequence reaches
    the terminal, and callers render the result as literal text, never markup.
    """
    s = _UNSAFE.sub("\ufffd", str(text))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def number(value: float | int | None, digits: int = 4) -> str:
    """A short human form: 0.0123, 1.23e-05, 12.3k, nan, -."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(value, int) and abs(value) < 100_000:
        return str(value)
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e5:
        for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if a >= scale:
                return f"{v / scale:.{max(digits - 1, 3)}g}{unit}"
    if a < 1e-3:
        return f"{v:.{max(digits - 2, 1)}e}"
    return f"{v:.{digits}g}"


def size(n_bytes: float | int | None) -> str:
    """Bytes as B, KiB, MiB, GiB, TiB."""
    if n_bytes is None:
        return "-"
    n = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def duration(seconds: float | None) -> str:
    """Seconds as 45s, 12m03s, 3h07m, 2d04h."""
    if seconds is None or seconds < 0 or math.isnan(seconds):
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def seconds_short(value: float | None) -> str:
    """A step time: 850µs, 12.3ms, 1.20s."""
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f}µs"
    if value < 1:
        return f"{value * 1e3:.1f}ms"
    return f"{value:.2f}s"
