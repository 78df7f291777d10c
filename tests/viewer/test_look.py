"""The viewer's look from its settings (theme, window, smoothing at start), and x: the screen saved as an SVG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.sources import FileSource

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, shown, until, write_ledger

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


async def test_the_settings_set_the_theme_the_window_and_the_smoothing_at_start():
    app = TuiwatchApp(
        FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW, theme="light", window=1000, smoothing=0.9
    )
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await drawn(pilot)
        assert app.theme == "textual-light"
        view = app.query_one(TrainingPane).view
        assert view is not None
        assert (view.loss.window, view.loss.smooth) == (1000, 0.9)


@pytest.mark.parametrize("where", ["run dir", "cwd"])
async def test_x_saves_the_screen_in_the_run_directory_or_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
):
    records = [json.loads(line) for line in (LEDGERS / "healthy.jsonl").read_text().splitlines()]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records[0]["run_dir"] = str(run_dir) if where == "run dir" else "/nonexistent/on/this/host"
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    app = RecordingApp(FileSource(write_ledger(run_dir / "ledger.jsonl", records)), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, shown(app, "finished"))
        await drawn(pilot)
        await pilot.press("x", "x")
        target = run_dir if where == "run dir" else here
        saved = sorted(p.name for p in target.glob("screen-*.svg"))
        assert saved == ["screen-step149-2.svg", "screen-step149.svg"]
        assert "step&#160;149" in (target / "screen-step149.svg").read_text()
        assert any(n.startswith(f"screenshot: {target}/screen-step149.svg") for n in app.notes)
