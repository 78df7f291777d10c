"""The viewer's config file: read at start, each bad setting one line and its default, flags over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuiwatch.cli.attach import viewer_options
from tuiwatch.cli.main import build_parser
from tuiwatch.cli.settings import Settings, load_settings


def test_no_file_is_the_defaults(tmp_path: Path):
    assert load_settings(tmp_path / "config.toml") == Settings()


def test_a_file_sets_each_setting(tmp_path: Path):
    path = tmp_path / "config.toml"
    path.write_text('theme = "light"\nfps = 10\nwindow = "1000"\nsmoothing = 0.9\nbell = false\n')
    assert load_settings(path) == Settings(theme="light", fps=10.0, window="1000", smoothing=0.9, bell=False)


def test_each_bad_setting_is_one_line_and_its_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "config.toml"
    path.write_text('theme = "neon"\nfps = 1000\nwindow = 50\nsmoothing = 0.5\nbell = "yes"\ncolour = 1\n')
    assert load_settings(path) == Settings()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 6
    assert lines[0] == f"tuiwatch: {path}: theme = 'neon' is not dark, light, ansi, ascii; using the default"
    assert "fps = 1000 is not a number from 0.5 to 60" in lines[1]
    assert "unknown setting 'colour'" in lines[5]


def test_a_file_that_is_not_toml_is_one_line_and_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "config.toml"
    path.write_text("theme = = dark\n")
    assert load_settings(path) == Settings()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tuiwatch: {path} cannot be read (TOMLDecodeError:")


def test_flags_win_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "tuiwatch").mkdir()
    (tmp_path / "tuiwatch" / "config.toml").write_text('theme = "light"\nfps = 10\nsmoothing = 0.6\nbell = false\n')
    options = viewer_options(build_parser().parse_args(["attach", "x"]))
    assert {k: options[k] for k in ("theme", "fps", "smoothing", "bell", "window")} == {
        "theme": "light",
        "fps": 10.0,
        "smoothing": 0.6,
        "bell": False,
        "window": None,
    }
    options = viewer_options(build_parser().parse_args(["replay", "x", "--theme", "ansi", "--fps", "2"]))
    assert (options["theme"], options["fps"]) == ("ansi", 2.0)
