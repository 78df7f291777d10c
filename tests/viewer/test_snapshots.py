"""What the user sees, as SVG snapshots: four runs at four terminal sizes, from 60×20 to 200×60.

``gpu.jsonl`` is ``healthy.jsonl`` with the fields a CUDA run writes (device
total, allocator bytes, NVML readings), made up: there is no GPU here.

Regenerate after an intended change with ``pytest tests/viewer/test_snapshots.py --snapshot-update``
and look at the SVGs under ``tests/__snapshots__/`` before committing them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.baseline import Baseline
from tuiwatch.viewer.sources import FileSource

from ..viewer_helpers import FIXED_NOW, shown, until

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"
# healthy.jsonl has three evals; alerts.jsonl ends nonfinite; killed.jsonl has no end record.
CASES = {"healthy": "finished", "alerts": "failed", "killed": "disconnected", "gpu": "finished"}
SIZES = [(60, 20), (80, 24), (120, 36), (200, 60)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("ledger", list(CASES))
def test_viewer_snapshot(snap_compare: Any, ledger: str, size: tuple[int, int]) -> None:
    app = TuiwatchApp(FileSource(LEDGERS / f"{ledger}.jsonl"), clock=lambda: FIXED_NOW)

    async def settled(pilot: Any) -> None:
        await until(pilot, shown(app, CASES[ledger]), what=CASES[ledger])
        app.redraw(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_metrics_view_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    app = TuiwatchApp(FileSource(LEDGERS / "gpu.jsonl"), clock=lambda: FIXED_NOW)

    async def settled(pilot: Any) -> None:
        await until(pilot, shown(app, "finished"), what="finished")
        await pilot.press("m")
        app.redraw(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_compare_view_snapshot(snap_compare: Any, size: tuple[int, int], tmp_path: Path) -> None:
    """``replay healthy --compare B``, B's loss 1 % higher from step 60: B in pink in every chart, the dotted
    line at step 60, the title saying so."""
    records = [json.loads(line) for line in (LEDGERS / "healthy.jsonl").read_text().splitlines()]
    for r in records:
        if r["kind"] == "step" and r["step"] >= 60:
            r["loss"] *= 1.01
        if r["kind"] == "run":
            r["name"] = "other-seed"
    baseline = Baseline.of(records)
    app = TuiwatchApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW, baseline=baseline)

    async def settled(pilot: Any) -> None:
        await until(pilot, shown(app, "finished"), what="finished")
        app.redraw(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=settled)
