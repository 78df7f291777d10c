"""Reading what a tmux pane shows (the server itself is the `tmux` fixture in conftest.py)."""

from __future__ import annotations

import re
import subprocess

HEADER = re.compile(r"tuiwatch\s+(\S+)@\S+\s+step ([\d,]+)")


def capture(tmux: list[str], pane: str) -> str:
    return subprocess.run([*tmux, "capture-pane", "-p", "-t", pane], capture_output=True, text=True).stdout
