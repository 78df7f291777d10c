"""Does a frozen viewer slow the training? Step times with and without one, side by side in one run.

Each round trains the demo MLP twice in fresh processes (`tuiwatch demo
--no-viewer --delay 0`): once alone, once with a viewer that connects, reads
for a moment and is then stopped with SIGSTOP for the rest of the run (10 s
by default), then continued. The order alternates between rounds. The step
time is data wait + compute from each ledger; the table prints the paired
ratios of p50 and p99 (SPEC bar: p50 < 1 %, p99 < 5 % slower), and what the
run recorded about the viewer (dropped).

    python bench/stalled_viewer.py [--rounds 3] [--steps 30000] [--stop-s 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.socketdir import list_sockets

CLIENT = """
import sys
from tuiwatch.ledger.wire import connect
sock = connect(sys.argv[1], timeout=30)
while sock.recv(1 << 16):
    pass
"""


def train(workdir: Path, steps: int, stall_s: float | None) -> tuple[list[float], dict[str, object]]:
    socket_dir = workdir / "s"
    socket_dir.mkdir(mode=0o700)
    env = {**os.environ, "TUIWATCH_DIR": str(socket_dir)}
    argv = [sys.executable, "-m", "tuiwatch", "demo", "--no-viewer", "--delay", "0", "--steps", str(steps),
            "--run-dir", str(workdir / "runs")]  # fmt: skip
    run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    viewer = None
    if stall_s is not None:
        deadline = time.monotonic() + 60
        while not list_sockets(socket_dir) and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting for another process to create its socket
        path = list_sockets(socket_dir)[0].path
        viewer = subprocess.Popen([sys.executable, "-c", CLIENT, str(path)], env=env)
        time.sleep(0.5)  # it reads for a moment ...
        viewer.send_signal(signal.SIGSTOP)  # ... then freezes
        time.sleep(stall_s)
        viewer.send_signal(signal.SIGCONT)
    run.wait()
    if viewer is not None:
        viewer.kill()
        viewer.wait()
    ledger = next((workdir / "runs").glob("*/ledger.jsonl"))
    records = list(read_ledger(ledger))
    times = [r["data_wait_s"] + r["compute_s"] for r in records if r["kind"] == "step"]
    return times[100:], records[-1]  # the first steps are warm-up in both


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30000, help="long enough to outlast the stop")
    p.add_argument("--stop-s", type=float, default=10.0)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tuiwatch-stall-") as tmp:
        for n in range(args.rounds):
            runs = {}
            for stalled in (False, True) if n % 2 == 0 else (True, False):
                work = Path(tmp) / f"{n}-{int(stalled)}"
                work.mkdir()
                runs[stalled] = train(work, args.steps, args.stop_s if stalled else None)
            (base, _), (with_viewer, end) = runs[False], runs[True]
            rows.append((quantile(with_viewer, 0.5) / quantile(base, 0.5), quantile(with_viewer, 0.99) /
                         quantile(base, 0.99), end.get("dropped_viewers"), end.get("dropped_records")))  # fmt: skip
    print("round  p50 with/without  p99 with/without  dropped viewers  dropped records")
    for n, (p50, p99, viewers, dropped) in enumerate(rows):
        print(f"{n:>5}  {p50:>16.3f}  {p99:>16.3f}  {viewers!s:>15}  {dropped!s:>15}")
    p50s, p99s = [r[0] for r in rows], [r[1] for r in rows]
    print(f"median  {statistics.median(p50s):>15.3f}  {statistics.median(p99s):>16.3f}")


if __name__ == "__main__":
    main()
