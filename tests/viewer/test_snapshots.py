"""What the user sees, as SVG snapshots: four runs at two terminal sizes.

``gpu.jsonl`` is ``healthy.jsonl`` with the fields a CUDA run writes (device
total, allocator bytes, NVML readings), made up: there is no GPU here.

Regenerate after an intended change with ``pytest tests/viewer/test_snapshots.py --snapshot-update``
and look at the SVGs under ``tests/__snapshots__/`` before committing them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.sources import FileSource

from ..viewer_helpers import FIXED_NOW, until

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"
CASES = {"healthy": "finished", "alerts": "finished", "killed": "disconnected", "gpu": "finished"}


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
@pytest.mark.parametrize("ledger", list(CASES))
def test_viewer_snapshot(snap_compare: Any, ledger: str, size: tuple[int, int]) -> None:
    app = TuiwatchApp(FileSource(LEDGERS / f"{ledger}.jsonl"), clock=lambda: FIXED_NOW)

    async def settled(pilot: Any) -> None:
        await until(pilot, lambda: app.state.status == CASES[ledger], what=CASES[ledger])
        app.redraw(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=settled)
