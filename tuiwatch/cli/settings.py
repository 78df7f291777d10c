"""The viewer's lasting settings: a small TOML file the user writes, read at start; flags override it.

``$XDG_CONFIG_HOME/tuiwatch/config.toml`` (default ``~/.config/tuiwatch/config.toml``)::

    theme = "dark"     # dark, light, ansi (the terminal's own 16 colours) or ascii (and ASCII only)
    fps = 4            # frames a second at most, 0.5 to 60
    window = "all"     # the charts' window at start: all, 1000 or 100 steps
    smoothing = 0      # the loss's moving average at start: 0, 0.6, 0.9 or 0.99
    bell = true        # ring the terminal bell for a critical alert (attach)

A file that cannot be read, or a setting that is not one of these, gives one
line on stderr naming it and what is allowed, and the default is used: a
viewer always starts.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tuiwatch.viewer import DEFAULT_FPS, SMOOTHING, THEMES

WINDOWS = {"all": None, "1000": 1000, "100": 100}


@dataclass(frozen=True)
class Settings:
    theme: str = "dark"
    fps: float = DEFAULT_FPS
    window: str = "all"
    smoothing: float = 0.0
    bell: bool = True


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tuiwatch" / "config.toml"


def _valid(name: str, value: Any) -> bool:
    if name == "theme":
        return value in THEMES
    if name == "fps":
        return type(value) in (int, float) and 0.5 <= value <= 60
    if name == "window":
        return str(value) in WINDOWS
    if name == "smoothing":
        return type(value) in (int, float) and float(value) in SMOOTHING
    return type(value) is bool  # bell


ALLOWED = {
    "theme": ", ".join(THEMES),
    "fps": "a number from 0.5 to 60",
    "window": "all, 1000 or 100",
    "smoothing": ", ".join(f"{s:g}" for s in SMOOTHING),
    "bell": "true or false",
}


def load_settings(path: Path | None = None) -> Settings:
    """The settings of the config file, each one that is missing or wrong at its default (said in one line)."""
    path = path or config_path()
    if not path.exists():
        return Settings()
    try:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        _warn(f"{path} cannot be read ({type(exc).__name__}: {exc}); using the defaults")
        return Settings()
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known:
            _warn(f"{path}: unknown setting {name!r} (known: {', '.join(sorted(known))}); left out")
        elif not _valid(name, value):
            _warn(f"{path}: {name} = {value!r} is not {ALLOWED[name]}; using the default")
        else:
            values[name] = str(value) if name == "window" else float(value) if name in ("fps", "smoothing") else value
    return Settings(**values)


def _warn(line: str) -> None:
    print(f"tuiwatch: {line}", file=sys.stderr)
