"""``--theme ascii``: the same screen, every character in ASCII, each as wide as the one it stands for."""

from __future__ import annotations

from pathlib import Path

from rich.cells import cell_len

from tuiwatch.viewer.render.ascii import ascii_only, braille
from tuiwatch.viewer.sources import FileSource

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, screen_text, shown, until

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"
LEFT, RIGHT = (0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80)  # a braille cell's dots, top to bottom


def cell(*dots: tuple[int, int]) -> str:
    """The braille character with dots at (column, row)."""
    return chr(0x2800 + sum((LEFT, RIGHT)[c][r] for c, r in dots))


def test_a_braille_cell_becomes_the_stroke_or_mark_at_the_height_of_its_dots():
    assert braille(cell()) == " "
    assert braille(cell((0, 0), (0, 1), (0, 2), (0, 3))) == "|"
    assert braille(cell((0, 1), (1, 3))) == "|"  # a steep step across the cell
    assert braille(cell((0, 0), (1, 0))) == "'"
    assert braille(cell((0, 1))) == "-"
    assert braille(cell((0, 1), (1, 2))) == "-"
    assert braille(cell((1, 2))) == "."
    assert braille(cell((0, 3), (1, 3))) == "_"


def test_every_character_becomes_ascii_as_wide():
    text = "╭─ training ─╮ ⡇⠀⣀┊ ↑↓ ● ▲ nonfinite@120 » ×3 wait 743µs 42°C █░ run 名前 é"
    said = ascii_only(text)
    assert said.isascii()
    assert cell_len(said) == cell_len(text)
    assert said == "+- training -+ | _: ^v * ^ nonfinite@120 > x3 wait 743us 42oC #. run ???? e"
    assert ascii_only("plain") == "plain"


async def test_the_ascii_theme_draws_the_dark_theme_s_screen_in_ascii():
    """Every line of every screen (the panes with a cursor and clipping, the metrics view, an alert's dialog,
    the footer) is the dark theme's line made ASCII: nothing moves, nothing is left out."""

    async def screens(theme: str) -> list[list[str]]:
        app = RecordingApp(FileSource(LEDGERS / "alerts.jsonl"), clock=lambda: FIXED_NOW, theme=theme)
        shots = []
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, shown(app, "failed"))
            await pilot.press("o", "full_stop")
            await drawn(pilot)
            shots.append(screen_text(app))
            await pilot.press("m")
            await drawn(pilot)
            shots.append(screen_text(app))
            await pilot.press("m", "tab", "tab", "tab", "enter")  # the alerts pane: its newest alert, whole
            await pilot.pause()
            shots.append(screen_text(app))
        return shots

    dark, plain = await screens("dark"), await screens("ascii")
    for dark_lines, ascii_lines in zip(dark, plain, strict=True):
        assert all(line.isascii() for line in ascii_lines)
        assert ascii_lines == [ascii_only(line) for line in dark_lines]
    main = plain[0]
    assert main[0].startswith(" tuiwatch  demo-mlp  step 120  epoch 1  0s  * stopped: nonfinite at step 120  ^")
    assert any(line.startswith("|   0.735|||") for line in main)  # the loss chart: its first steps' fall
    assert any("esc: close" in line for line in plain[2]), "the alert's own screen"


async def test_a_dialog_taller_than_the_terminal_is_ascii_its_scrollbar_too():
    app = RecordingApp(FileSource(LEDGERS / "alerts.jsonl"), clock=lambda: FIXED_NOW, theme="ascii")
    async with app.run_test(size=(100, 30)) as pilot:  # shorter than the help: its screen scrolls
        await until(pilot, shown(app, "failed"))
        await pilot.press("question_mark")
        await pilot.pause()
        lines = screen_text(app)
        assert all(line.isascii() for line in lines)
        assert any("< >" in line for line in lines)  # the arrow keys, said in ASCII
