"""``i`` shows how the run was started and watched; a critical alert that just happened rings the bell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.cli.attach import viewer_options
from tuiwatch.cli.main import build_parser
from tuiwatch.viewer.run_info import VALUE_CHARS, run_info
from tuiwatch.viewer.screens.run_info import RunInfoScreen
from tuiwatch.viewer.sources import FileSource

from ..viewer_helpers import FIXED_NOW, RecordingApp, shown, until

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"
CRITICAL_T = 1796230554.1144536  # alerts.jsonl's nonfinite alert


def records(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (LEDGERS / name).read_text().splitlines()]


def test_the_run_record_and_the_latest_system_record_as_lines():
    ledger = records("gpu.jsonl")
    system = [r for r in ledger if r["kind"] == "system"][-1]
    lines = dict(run_info(ledger[0], system))
    assert lines["host"] == "gpu-box, pid 4242"
    assert lines["command"] == "train.py"
    assert lines["model"] == "Sequential, 162 parameters"
    assert lines["device"] == "cuda:0, 80.0 GiB of memory"
    assert lines["versions"] == "torch 2.13.0+cu128, CUDA 12.8, tuiwatch 0.1.0"
    assert lines["watch"] == "every=1, on_nonfinite=stop, update_norm_every=10, param_norm_every=1"
    assert lines["process"] == "CPU 104%, RSS 6.2 GiB, 4 loader workers at 31% 28% 30% 28%"
    assert lines["gpu 0"] == "cuda:0, util 96%, memory 31.4/80.0 GiB (30.9 GiB this run's), 64°C, 413 W"
    assert "rank" not in lines  # one process: no rank line
    assert "resumed from" not in lines  # absent fields are left out, not shown as None


@pytest.mark.parametrize(
    ("rules", "note", "line"),
    [
        (None, None, None),  # every rule with its defaults: nothing to say
        (["nonfinite", "oom"], None, "only nonfinite, oom"),
        ({"data-bound": False, "loss-chance": {"classes": 10}}, None, "off: data-bound; thresholds set: loss-chance"),
        (
            {"loss-spike": False, "grad-explosion": False},
            "reinforcement learning (gymnasium is imported): ...",
            "off: loss-spike, grad-explosion; reinforcement learning (gymnasium is imported): ...",
        ),
    ],
)
def test_the_rules_line_says_which_differ_from_the_defaults_and_why(rules: Any, note: Any, line: str | None):
    assert dict(run_info({"rules": rules, "rules_note": note}, {})).get("rules") == line


def test_a_hostile_or_partial_run_record_gives_safe_lines_and_nothing_made_up():
    run = {
        "name": "evil\x1b]0;owned\x07",
        "argv": ["train.py", "--tag", "a b", *(["--x"] * 200)],
        "world_size": 8,
        "rank": 3,
        "local_rank": 1,
        "params": "many",
        "integration": {"by": "tuiwatch run", "not_seen": ["sample ids"]},
    }
    lines = dict(run_info(run, {"gpus": None, "gpu_error": "no NVML library"}))
    assert "\x1b" not in lines["name"]
    assert "\x07" not in lines["name"]
    assert lines["command"].startswith("train.py --tag 'a b' --x")
    assert len(lines["command"]) == VALUE_CHARS
    assert lines["command"].endswith("…")
    assert lines["rank"] == "3 of 8 (local rank 1)"
    assert "model" not in lines  # a params field that is not a count, and no class name: nothing to say
    assert lines["integration"] == "tuiwatch run"
    assert lines["not seen"] == "sample ids"
    assert lines["gpus"] == "no NVML library"


async def test_i_opens_the_run_info_and_closes_it():
    app = RecordingApp(FileSource(LEDGERS / "gpu.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, shown(app, "finished"))
        await pilot.press("i")
        assert isinstance(app.screen, RunInfoScreen)
        assert ("model", "Sequential, 162 parameters") in app.screen.lines
        await pilot.pause()
        screen = app.export_screenshot().replace("&#160;", " ")
        assert "Sequential, 162 parameters" in screen
        assert "cuda:0, util 96%" in screen
        await pilot.press("i")
        assert not isinstance(app.screen, RunInfoScreen)


class LiveFile(FileSource):
    """The records of a ledger as a live run's socket would bring them (the bell is for live runs only)."""

    live = True


class Belled(RecordingApp):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rang = 0

    def bell(self) -> None:
        self.rang += 1


@pytest.mark.parametrize(
    ("source", "after_s", "bell", "rings"),
    [
        (LiveFile, 5.0, True, 1),  # a critical alert 5 s old as it arrives: once, though a warning came too
        (LiveFile, 60.0, True, 0),  # a minute old: history a late viewer is sent, not news
        (LiveFile, 5.0, False, 0),  # attach --no-bell
        (FileSource, 5.0, True, 0),  # a replay never rings
    ],
    ids=["live", "history", "no-bell", "replay"],
)
async def test_a_critical_alert_that_just_happened_rings_the_bell_once(
    source: type[FileSource], after_s: float, bell: bool, rings: int
):
    app = Belled(source(LEDGERS / "alerts.jsonl"), clock=lambda: CRITICAL_T + after_s, bell=bell)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.loading is None and any(a.rule == "nonfinite" for a in app.state.alerts))
        await pilot.pause()
        assert app.rang == rings


def test_attach_takes_no_bell_into_the_app_options():
    options = viewer_options(build_parser().parse_args(["attach", "--no-bell", "--fps", "10", "x"]))
    assert (options["fps"], options["bell"], options["baseline"]) == (10.0, False, None)
    assert viewer_options(build_parser().parse_args(["attach", "x"]))["bell"] is True


def test_a_resumed_record_shows_where_the_run_was_resumed_from():
    # watch.restore() and the Lightning and Trainer callbacks link back in a resumed record, not in the run record.
    from tuiwatch.viewer.state import RunState

    state = RunState()
    state.apply_all(
        [
            {"kind": "run", "t": 0.0, "name": "resumed", "resumed_from": None},
            {"kind": "resumed", "t": 0.1, "resumed_from": {"checkpoint": "/out/checkpoint-40", "step": 40}},
            {"kind": "resumed", "t": 0.2, "resumed_from": {"checkpoint": "/elsewhere", "step": 7}},  # the first counts
            {"kind": "resumed", "t": 0.3, "resumed_from": "not a link"},
        ]
    )
    assert dict(run_info(state.run, {}))["resumed from"] == "/out/checkpoint-40, step 40"
    state.apply({"kind": "run", "t": 1.0, "name": "next part"})  # a later part of a replayed chain starts afresh
    assert "resumed from" not in dict(run_info(state.run, {}))
