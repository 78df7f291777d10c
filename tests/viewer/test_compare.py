"""``--compare B``: another run in every chart, aligned by step, and the first step where the two part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuiwatch.analysis.diff import Parting
from tuiwatch.viewer.baseline import Baseline
from tuiwatch.viewer.panes.metrics import MetricsPane
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.render.chart import LABEL_WIDTH
from tuiwatch.viewer.sources import FileSource, read_run

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, shown, until, write_ledger

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


def healthy() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (LEDGERS / "healthy.jsonl").read_text().splitlines()]


def parted_at(step: int) -> list[dict[str, Any]]:
    """healthy.jsonl with its loss 1% higher from ``step`` on: another seed, say."""
    records = healthy()
    for r in records:
        if r["kind"] == "step" and r["step"] >= step:
            r["loss"] *= 1.01
        if r["kind"] == "run":
            r["name"] = "other-seed"
    return records


def test_the_first_step_where_two_runs_part_is_found_as_the_watched_run_s_records_come():
    parting = Parting(parted_at(60))
    for record in healthy():
        parting.feed(record)
    assert parting.found is not None
    assert (parting.found.step, parting.found.field) == (60, "loss")
    assert parting.said() == "parts at step 60 (loss)"
    assert parting.compared == 60
    same = Parting(healthy())
    same.feed(healthy()[0])
    assert same.said() == "no common step yet"
    for record in healthy():
        same.feed(record)
    assert same.said() == "same for 150 steps"
    short = Parting(healthy(), max_steps=100)
    for record in healthy():
        short.feed(record)
    assert short.said() == "same for 100 steps (steps past 100 not compared)"
    parting.reset()  # the watched run's stream starts over (a reconnect)
    assert parting.found is None
    assert parting.said() == "no common step yet"


async def test_replay_compare_draws_the_other_run_in_every_chart_and_says_where_they_part(tmp_path: Path):
    (tmp_path / "b").mkdir()
    other = write_ledger(tmp_path / "b" / "ledger.jsonl", parted_at(60))
    baseline = Baseline.of(read_run(other.parent))
    assert baseline.label == "other-seed"
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW, baseline=baseline)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, shown(app, "finished"))
        await drawn(pilot)
        training = app.query_one(TrainingPane)
        assert training.view is not None
        assert plain(training).splitlines()[0].endswith("vs other-seed: parts at step 60 (loss)")
        assert [line.role for line in training.view.loss.lines] == ["train", "eval", "compare"]
        assert training.view.loss.lines[2].series is baseline.state.metrics["loss"]
        assert [line.role for line in training.view.lr.lines] == ["lr", "compare"]
        # The step where they part: a dotted line in every chart, at the column of step 60 of 0-149.
        assert {training.view.loss.mark, training.view.lr.mark, training.view.grad_norm.mark} == {60}
        width = training.content_region.width - LABEL_WIDTH
        column = LABEL_WIDTH + round(60 * (width * 2 - 1) / 149) // 2
        rows = plain(training).splitlines()
        dotted = [i for i, row in enumerate(rows) if "┊" in row]
        assert len(dotted) > 10
        assert all(rows[i].index("┊") == column and rows[i].count("┊") == 1 for i in dotted)
        await pilot.press("m")
        await drawn(pilot)
        metrics = app.query_one(MetricsPane).view
        assert metrics is not None
        cells = {c.name: c for c in metrics.cells}
        assert [line.role for line in cells["loss"].chart.lines] == ["train", "compare"]
        assert [line.role for line in cells["eval val_loss"].chart.lines] == ["eval", "compare"]
        assert {c.chart.mark for c in metrics.cells} == {60}


def test_a_compare_run_that_cannot_be_read_is_a_one_line_error(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "tuiwatch", "replay", str(LEDGERS / "healthy.jsonl"), "--compare", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1
    assert str(tmp_path) in out.stderr
