"""Helpers for driving the real app in tests."""

from __future__ import annotations

import html
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
from rich.console import Group
from rich.text import Text
from textual.pilot import Pilot

from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.panes.base import Pane
from tuiwatch.viewer.ranks import RanksState

FIXED_NOW = 1_796_230_000.0


def write_ledger(path: Path, records: list[dict[str, Any]]) -> Path:
    """``records`` as a ledger file at ``path`` (JSON Lines, as the publisher writes them)."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


class RecordingApp(TuiwatchApp):
    """The real app, remembering the notifications it showed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notes: list[str] = []

    def notify(self, message: str, **kwargs: Any) -> None:  # type: ignore[override]
        self.notes.append(message)
        super().notify(message, **kwargs)


def plain(widget: Pane) -> str:
    """What a pane draws, as plain text."""
    rendered = widget.render()
    parts = rendered.renderables if isinstance(rendered, Group) else [rendered]
    return "\n".join(p.plain for p in parts if isinstance(p, Text))


def shown(app: TuiwatchApp, status: str) -> Any:
    """A predicate for :func:`until`: the run reached ``status`` and a replay has read its whole ledger (the
    end record is applied a moment before the source says it has read the last byte: the header says
    "loading 99%" in between)."""
    return lambda: app.state.status == status and app.loading is None


async def until(pilot: Pilot[Any], predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            status = getattr(getattr(pilot.app, "state", None), "status", "?")
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (viewer status: {status})")
        await pilot.pause(0.02)


async def drawn(pilot: Pilot[Any]) -> None:
    """Push the state down to the panes now and let the screen settle: no wait for the redraw timer."""
    app = pilot.app
    assert isinstance(app, TuiwatchApp)
    app.redraw(force=True)
    await pilot.pause()


async def ranks_stepping(pilot: Pilot[Any], app: TuiwatchApp, past: int = 5) -> RanksState:
    """A job's viewer once every rank has shown steps past ``past``: its RanksState."""
    ranks = app.ranks
    assert ranks is not None
    await until(pilot, lambda: all((s.step or 0) > past for s in ranks.ranks.values()), 60, "every rank's steps")
    return ranks


_SVG_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)" textLength="([\d.]+)"[^>]*>([^<]*)</text>')


def screen_text(app: TuiwatchApp) -> list[str]:
    """The whole screen as lines of text, read back from the SVG screenshot Textual draws (the panes, the
    dialogs over them, the borders and the footer: what the terminal shows)."""
    rows: dict[float, list[tuple[float, str]]] = defaultdict(list)
    svg = app.export_screenshot()
    for x, y, _length, text in _SVG_TEXT.findall(svg):
        rows[float(y)].append((float(x), html.unescape(text).replace("\xa0", " ")))
    cell = 20 * 0.61  # Rich's export_svg: a cell is 20 px high and 0.61 of that wide
    lines = []
    for y in sorted(rows):
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / cell)) + text
        lines.append(line)
    return lines
