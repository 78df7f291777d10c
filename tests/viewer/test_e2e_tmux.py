"""The viewer in a real terminal: tmux runs the demo in one pane and ``tuiwatch attach`` in another."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuiwatch.analysis.format import number
from tuiwatch.ledger.reader import read_ledger

from ..helpers import wait_until
from ..tmux_helpers import HEADER, capture

pytestmark = [
    pytest.mark.integration,  # a real terminal through tmux
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]
LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"
LOSS = re.compile(r"│ loss (\S+)")
CHECKPOINT = re.compile(r"checkpointwritten:(/\S+?\.pt)\(")


def _joined(screen: str) -> str:
    """The screen's lines joined without borders or spaces: a long path wraps anywhere in a pane."""
    return "".join(line.strip("│ ") for line in screen.splitlines()).replace(" ", "")


def _panes(tmux: list[str]) -> list[str]:
    out = subprocess.run([*tmux, "list-panes", "-t", "e2e", "-F", "#{pane_id}"], capture_output=True, text=True)
    return out.stdout.split()


def _frame(tmux: list[str], pane: str) -> tuple[int, str] | None:
    screen = capture(tmux, pane)
    header, loss = HEADER.search(screen), LOSS.search(screen)
    if header is None or loss is None:
        return None
    return int(header.group(2).replace(",", "")), loss.group(1)


def _ledger_steps(run_root: Path) -> dict[int, float]:
    ledger = next(run_root.glob("*/ledger.jsonl"), None)
    if ledger is None:
        return {}
    return {r["step"]: r["loss"] for r in read_ledger(ledger) if r["kind"] == "step"}


def test_attach_shows_the_run_live_and_q_leaves_the_run_running(tmux: list[str], socket_dir: Path, tmp_path: Path):
    run_root = tmp_path / "runs"
    env = f"env -u COLUMNS -u LINES TUIWATCH_DIR={socket_dir} TERM=xterm-256color"
    demo = f"{env} {sys.executable} -m tuiwatch demo --no-viewer --steps 100000 --delay 0.02 --run-dir {run_root}"
    attach = f"{env} {sys.executable} -m tuiwatch attach demo-mlp"
    subprocess.run([*tmux, "new-session", "-d", "-s", "e2e", "-x", "220", "-y", "40", demo], check=True)
    wait_until(lambda: _ledger_steps(run_root), what="the demo's first steps")
    subprocess.run([*tmux, "split-window", "-h", "-t", "e2e", attach], check=True)
    viewer = _panes(tmux)[-1]

    first = wait_until(lambda: _frame(tmux, viewer), timeout=30, what="the viewer's first frame")

    def advanced() -> tuple[int, str] | None:
        frame = _frame(tmux, viewer)
        return frame if frame is not None and frame[0] > first[0] + 5 else None

    assert wait_until(advanced, what="the step to advance")[0] > first[0]

    # The loss on screen is the ledger's loss at the step the screen shows.
    def consistent() -> bool:
        frame = _frame(tmux, viewer)
        steps = _ledger_steps(run_root)
        return frame is not None and frame[0] in steps and number(steps[frame[0]]) == frame[1]

    wait_until(consistent, what="a frame whose loss matches the ledger")

    # c: the run writes a checkpoint at its next step boundary; the alert pane, full screen, shows where.
    subprocess.run([*tmux, "send-keys", "-t", viewer, "c"], check=True)
    wait_until(lambda: "checkpoint written:" in capture(tmux, viewer), what="the checkpoint's reply on screen")
    subprocess.run([*tmux, "send-keys", "-t", viewer, "Tab", "Tab", "Tab", "f"], check=True)
    shown = wait_until(lambda: CHECKPOINT.search(_joined(capture(tmux, viewer))), what="the checkpoint's path")
    written = Path(shown.group(1))
    assert written.parent.parent.parent == run_root
    assert written.stat().st_size > 0
    subprocess.run([*tmux, "send-keys", "-t", viewer, "f"], check=True)

    subprocess.run([*tmux, "send-keys", "-t", viewer, "q"], check=True)
    wait_until(lambda: viewer not in _panes(tmux), what="the viewer to quit")
    steps_at_quit = max(_ledger_steps(run_root))
    wait_until(lambda: max(_ledger_steps(run_root)) > steps_at_quit + 5, what="the run to go on after q")


def test_a_60x20_terminal_shows_the_alert_and_the_end_reason(tmux: list[str], socket_dir: Path):
    # env -u: the pane's own size, not COLUMNS/LINES the test runner's environment may carry into tmux.
    replay = (
        f"env -u COLUMNS -u LINES TUIWATCH_DIR={socket_dir} TERM=xterm-256color {sys.executable} -m tuiwatch replay "
    )
    replay += str(LEDGERS / "alerts.jsonl")
    subprocess.run([*tmux, "new-session", "-d", "-s", "small", "-x", "60", "-y", "20", replay], check=True)
    pane = _panes_of(tmux, "small")[0]

    def shown() -> str | None:
        screen = capture(tmux, pane)
        return screen if "crit" in screen and "nonfinite" in screen else None

    screen = wait_until(shown, timeout=30, what="the alert on a 60x20 screen")
    lines = screen.splitlines()
    assert "stopped: nonfinite at step 120" in lines[0]
    assert any(line.lstrip().startswith("q quit") for line in lines[-2:])
    assert max(len(line) for line in lines) <= 60
    subprocess.run([*tmux, "send-keys", "-t", pane, "q"], check=True)
    wait_until(lambda: not _panes_of(tmux, "small"), what="the replay to quit")


def _panes_of(tmux: list[str], session: str) -> list[str]:
    out = subprocess.run([*tmux, "list-panes", "-t", session, "-F", "#{pane_id}"], capture_output=True, text=True)
    return out.stdout.split()


def test_a_critical_alert_rings_the_bell_of_the_viewers_tmux_window(tmux: list[str], socket_dir: Path, tmp_path: Path):
    # numpy-graph: the loss goes through numpy, no gradient reaches the model, grad-zero (critical) at step 4.
    run_root = tmp_path / "runs"
    env = f"env -u COLUMNS -u LINES TUIWATCH_DIR={socket_dir} TERM=xterm-256color"
    demo = f"{env} {sys.executable} -m tuiwatch demo --no-viewer --fault numpy-graph --steps 600 --delay 0.05"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "bell", "-n", "train", f"{demo} --run-dir {run_root}"], check=True
    )
    wait_until(lambda: _ledger_steps(run_root), what="the demo's first steps")
    # -d: the viewer's window is not the one looked at, where tmux marks a bell (and can notify the desktop).
    attach = f"{env} {sys.executable} -m tuiwatch attach fault-numpy-graph"
    subprocess.run([*tmux, "new-window", "-d", "-t", "bell", "-n", "view", attach], check=True)

    def flag(option: str) -> str:
        out = subprocess.run([*tmux, "display", "-p", "-t", "bell:view", option], capture_output=True, text=True)
        return out.stdout.strip()

    wait_until(lambda: flag("#{window_bell_flag}") == "1", timeout=30, what="the bell in the viewer's window")
    # The bell goes with the records; the screen shows them at its next frame.
    wait_until(lambda: "grad-zero" in capture(tmux, "bell:view"), what="the alert on the viewer's screen")
