"""Draw docs/viewer.svg: the viewer on a real demo run, as the README shows it.

Trains the demo MLP (``tuiwatch demo --no-viewer``, 1,500 steps, the
``corrupt-batch`` fault so that the alert pane has something to say), then
opens the real viewer headless on its ledger at 120×36 and saves the screen.

    python demos/screenshot.py [--out docs/viewer.svg]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.sources import FileSource
from tuiwatch.viewer.state import ENDED


async def draw(ledger: Path, out: Path, size: tuple[int, int]) -> None:
    app = TuiwatchApp(FileSource(ledger))
    async with app.run_test(size=size) as pilot:
        for _ in range(500):
            if app.state.status in ENDED and app.loading is None:
                break
            await pilot.pause(0.02)
        app.redraw(force=True)
        await pilot.pause()
        out.write_text(app.export_screenshot(title="tuiwatch replay (the demo with --fault corrupt-batch)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parents[1] / "docs" / "viewer.svg"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "tuiwatch", "demo", "--no-viewer", "--delay", "0", "--steps", "1500"]
        subprocess.run([*argv, "--fault", "corrupt-batch", "--run-dir", tmp], check=True, stdout=subprocess.DEVNULL)
        ledger = next(Path(tmp).glob("*/ledger.jsonl"))
        asyncio.run(draw(ledger, Path(args.out), (120, 36)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
