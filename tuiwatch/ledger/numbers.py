"""Numbers written short and faithful: the one formatter of every number tuiwatch shows.

The viewer, ``report``, ``diff``, ``ls`` and the rules' alert messages all
write numbers through it (``tuiwatch.analysis.format`` re-exports it for the
viewer's side; it lives here, at the bottom of the pure layers, so that the
rules can use it too).
"""

from __future__ import annotations

import math
from typing import Any

from tuiwatch.ledger.fields import finite, is_number

# Up to T: a "P" or "E" suffix reads as an exponent to an engineer skimming at 2 a.m.
_SI = (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12))


def _sig(v: float, digits: int) -> str:
    """``v`` to ``digits`` significant digits, in fixed point (for 1e-3 <= |v| < 10**digits)."""
    text = f"{v:.{digits}g}"
    return text if "e" not in text else f"{v:.0f}"


def _exp(v: float, digits: int) -> str:
    """``1.2e-05`` written short: ``1.2e-5``, ``9.22e19``."""
    mantissa, exponent = f"{v:.{max(digits - 1, 0)}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def number(value: Any, digits: int = 4) -> str:
    """A short, faithful form: 0.0123, 1.2e-5, 1234, 12.35k, 40.2G, 9.22e19, nan, -.

    ``digits`` significant digits; plain up to ``10**digits``, then SI
    suffixes (k M G T), then an exponent. Integers below 100,000 are
    exact. Never a suffix on an exponent, never an exponent with a plus sign.
    """
    if isinstance(value, bool):
        return str(value).lower()
    if not is_number(value):
        return "-"
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
    if a < 1e-3:
        return _exp(v, digits)
    # Magnitudes are checked before formatting: a 1e300 is never written out in 301 digits.
    if a < 10**digits and float(_sig(a, digits)) < 10**digits:
        return _sig(v, digits)
    for unit, scale in _SI:
        if a / scale < 1000 and float(_sig(a / scale, digits)) < 1000:
            return _sig(v / scale, digits) + unit
    return _exp(v, digits)


def _in_unit(v: float, units: tuple[tuple[str, float], ...], digits: int) -> str:
    """``v`` in the largest of ``units`` (name, scale; largest first) it reaches, else the last one."""
    name, scale = next(((n, s) for n, s in units if abs(v) >= s), units[-1])
    return _sig(v / scale, digits) + name


def quantity(value: Any, unit: str = "", digits: int = 4) -> str:
    """A value in its unit: a plain number (``""``), seconds (``"s"``: 850µs, 12.3ms), or bytes (``"B"``: 312MiB)."""
    v = finite(value)
    if v == 0 and unit in ("s", "B"):
        return "0"
    if unit == "s" and v is not None:
        if abs(v) >= 10**digits or abs(v) < 1e-9:
            return _exp(v, digits) + "s"
        return _in_unit(v, (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)), digits)
    if unit == "B" and v is not None:
        if abs(v) >= 1000 * 2**40:
            return _exp(v, digits) + "B"
        if abs(v) < 1024:
            return f"{v:.0f}B"
        return _in_unit(v, (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)), digits)
    return number(value, digits)


def fit(value: Any, width: int, unit: str = "", digits: int = 4) -> str:
    """The most precise form of ``value`` (in its unit, up to ``digits`` significant digits) that fits ``width``
    characters; never cut into another number. One that cannot fit even at one digit is shown as ``…``.
    """
    for d in range(digits, 0, -1):
        text = quantity(value, unit, d)
        if len(text) <= width:
            return text
    # The bare number is still the value in the base unit (seconds, bytes): "-5e-100", not "-5e-100s".
    for d in range(digits, 0, -1):
        text = number(value, d)
        if len(text) <= width:
            return text
    return "…"
