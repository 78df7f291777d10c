"""Text from runs and ledgers is inert in every output: CLI lines, JSON, the run picker (issue 17, item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson

from tuiwatch.viewer.screens.run_picker import RunPicker
from tuiwatch.wire.discovery import LiveRun

from ..helpers import env_for

HOSTILE = "evil\x1b]0;PWNTITLE\x07\x9b2J\u202etxt.exe[reverse]x[/reverse][b"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def tw(socket_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuiwatch", *args], env=env_for(socket_dir), capture_output=True, text=True, timeout=60
    )


def test_report_json_and_text_carry_no_raw_escape(tmp_path: Path, socket_dir: Path):
    ledger = tmp_path / "ledger.jsonl"
    records = [
        {"kind": "run", "t": 1.0, "name": HOSTILE, "run_id": HOSTILE},
        {"kind": "step", "t": 2.0, "step": 0, "loss": 1.0},
        {"kind": "eval", "t": 2.0, "step": 0, HOSTILE: 0.5},
        {"kind": "end", "t": 3.0, "reason": HOSTILE},
    ]
    ledger.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    for args in (["report", "--json", str(ledger)], ["report", str(ledger)]):
        out = tw(socket_dir, *args)
        assert out.returncode == 0, out.stderr
        assert not any(c in out.stdout for c in RAW), args
    summary = json.loads(tw(socket_dir, "report", "--json", str(ledger)).stdout)
    assert summary["name"] == HOSTILE  # escaped in the JSON text, the same string once parsed


def test_an_error_line_naming_a_hostile_path_carries_no_raw_escape(tmp_path: Path, socket_dir: Path):
    out = tw(socket_dir, "replay", str(tmp_path / HOSTILE))
    assert out.returncode == 1
    assert out.stderr.startswith("tuiwatch: error: no ledger at ")
    assert not any(c in out.stderr for c in RAW)
    assert out.stderr.count("\n") == 1  # one line


async def test_the_run_picker_shows_names_literally():
    runs = [
        LiveRun(HOSTILE, 1, "/x.sock", 3, "live", None, None),
        LiveRun("[b", 2, "/y.sock", None, "live", None, None),
    ]
    app = RunPicker(runs)
    async with app.run_test(size=(100, 20)) as pilot:  # a name with half a markup tag used to crash it
        await pilot.pause()
        options = app.query_one("OptionList")
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(2)]  # type: ignore[attr-defined]
        assert "[reverse]x[" in prompts[0]  # the tag as written (the name is cut at 40 characters)
        assert prompts[1].startswith("[b ")
        assert not any(c in "".join(prompts) for c in RAW)
        await pilot.press("escape")
    assert app.return_value is None
