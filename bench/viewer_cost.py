"""What a viewer attached to a fast run costs: its own CPU share, and the training's slow-down, paired.

Each pair runs the demo training (``tuiwatch demo --no-viewer --delay 0``,
the MLP on one torch thread, a few hundred steps a second) twice, in random
order: alone, and with a viewer attached over its socket (the real
``TuiwatchApp``, headless, at ``--fps`` frames a second (the viewer's default), exiting when the
run ends). Throughput is steps over the ledger's own first-to-last-step time;
the viewer's CPU is its process time from its first step record to the
run's end (start-up and imports left out: they are paid once). On a shared,
noisy machine only the paired ratio means something: its median is printed,
with the load average.

    python bench/viewer_cost.py [--pairs 5] [--steps 3000] [--fps 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.viewer import DEFAULT_FPS
from tuiwatch.wire.socketdir import list_sockets, socket_dir

VIEWER = """
import sys
from pathlib import Path
from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.sources import SocketSource
from tuiwatch.viewer.state import ENDED

import time

class Headless(TuiwatchApp):
    started = None

    def redraw(self, force=False):
        super().redraw(force)
        if self.started is None and self.state.step is not None:
            self.started = (time.process_time(), time.monotonic())  # attached: imports and start-up are done
        if self.state.status in ENDED or self.state.status == "disconnected":
            self.exit()

app = Headless(SocketSource(Path(sys.argv[1]), None), fps=float(sys.argv[2]))
app.run(headless=True)
cpu, wall = app.started
print(time.process_time() - cpu, time.monotonic() - wall)
"""


def trial(tmp: Path, steps: int, viewer: bool, fps: float) -> tuple[float, float, float]:
    """(training steps/s, viewer CPU s, viewer wall s while attached) of one run."""
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "tuiwatch", "demo", "--no-viewer", "--delay", "0", "--steps", str(steps)]
    train = subprocess.Popen([*argv, "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, env=env)
    watcher = None
    if viewer:
        deadline = time.monotonic() + 60
        path = None
        while path is None and time.monotonic() < deadline:
            path = next((e.path for e in list_sockets(socket_dir()) if e.pid == train.pid), None)
            time.sleep(0.01)  # polling another process's socket into existence
        assert path is not None, "the training never opened its socket"
        watcher = subprocess.Popen([sys.executable, "-c", VIEWER, str(path), str(fps)], stdout=subprocess.PIPE)
    train.wait()
    viewer_cpu = viewer_wall = 0.0
    if watcher is not None:
        out, _ = watcher.communicate()
        viewer_cpu, viewer_wall = map(float, out.decode().split()[-2:])
    ledger = next(run_dir.glob("*/ledger.jsonl"))
    times = [r["t"] for r in read_ledger(ledger) if r.get("kind") == "step"]
    return (len(times) - 1) / (times[-1] - times[0]), viewer_cpu, viewer_wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--fps", type=float, default=DEFAULT_FPS)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-cost-"))
    ratios, shares, rates = [], [], []
    for i in range(args.pairs):
        order = [False, True]
        random.shuffle(order)
        got = {viewer: trial(tmp, args.steps, viewer, args.fps) for viewer in order}
        (alone, _, _), (watched, viewer_cpu, wall) = got[False], got[True]
        ratios.append(watched / alone)
        shares.append(viewer_cpu / wall)
        rates.append(alone)
        print(
            f"pair {i + 1}: alone {alone:.0f} steps/s, watched {watched:.0f} steps/s (x{watched / alone:.3f}); "
            f"viewer CPU {viewer_cpu:.2f} s over {wall:.1f} s = {viewer_cpu / wall:.1%} of a core",
            file=sys.stderr,
        )
    print(f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs; {args.pairs} pairs of {args.steps} steps")
    print(f"training alone: median {statistics.median(rates):.0f} steps/s")
    print(f"training with a viewer at {args.fps:g} fps / alone: median x{statistics.median(ratios):.3f}")
    print(f"the viewer's CPU while attached: median {statistics.median(shares):.1%} of a core (its process time)")


if __name__ == "__main__":
    main()
