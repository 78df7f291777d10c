"""Does a frozen viewer slow the training? Step times with and without one, side by side in one run.

Each round trains the demo MLP twice in fresh processes (`tuiwatch demo
--no-viewer --delay 0`): once alone, once with a viewer that connects, reads
for a moment and is then stopped with SIGSTOP for the rest of the run (10 s
by default), then continued. The order alternates between rounds. The step
time is data wait + compute from each ledger; the table prints the paired
ratios of p50 and p99 (SPEC bar: p50 < 1 %, p99 < 5 % slower), and what the
run recorded about the viewer (dropped).

    python bench/stalled_viewer.py [--rounds 3] [--steps 30000] [--stop-s 10]

Separate processes differ by more than the bar (placement, caches, other
load), so ``--within-run`` measures inside one long run instead: windows of
``--stop-s`` seconds alternate between no viewer and a viewer frozen with
SIGSTOP (a new one each time; the run drops each after its 5 s stall limit),
and the ratios compare each frozen window with the quiet windows either side
of it.

    python bench/stalled_viewer.py --within-run [--rounds 10] [--stop-s 10]
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
from tuiwatch.wire.socketdir import list_sockets

CLIENT = """
import sys
from tuiwatch.wire.protocol import connect
sock = connect(sys.argv[1], timeout=30)
while sock.recv(1 << 16):
    pass
"""


def train(workdir: Path, steps: int, stall_s: float | None) -> tuple[list[float], dict[str, object]]:
    socket_dir = workdir / "s"
    socket_dir.mkdir(mode=0o700)
    env = {**os.environ, "TUIWATCH_DIR": str(socket_dir)}
    argv = [
        sys.executable,
        "-m",
        "tuiwatch",
        "demo",
        "--no-viewer",
        "--delay",
        "0",
        "--steps",
        str(steps),
        "--run-dir",
        str(workdir / "runs"),
    ]
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


def within_run(rounds: int, window_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="tuiwatch-stall-") as tmp:
        workdir = Path(tmp)
        socket_dir = workdir / "s"
        socket_dir.mkdir(mode=0o700)
        env = {**os.environ, "TUIWATCH_DIR": str(socket_dir)}
        argv = [
            sys.executable,
            "-m",
            "tuiwatch",
            "demo",
            "--no-viewer",
            "--delay",
            "0",
            "--steps",
            "100000000",
            "--run-dir",
            str(workdir / "runs"),
        ]
        run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not list_sockets(socket_dir) and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting for another process to create its socket
        path = list_sockets(socket_dir)[0].path
        time.sleep(2.0)  # warm-up
        windows: list[tuple[bool, float, float]] = []
        for _ in range(rounds):
            for frozen in (False, True):
                start = time.time()
                if frozen:
                    viewer = subprocess.Popen([sys.executable, "-c", CLIENT, str(path)], env=env)
                    time.sleep(0.5)  # it connects and reads the history ...
                    viewer.send_signal(signal.SIGSTOP)  # ... then freezes
                    start = time.time()
                    time.sleep(window_s)
                    viewer.kill()
                    viewer.wait()
                else:
                    time.sleep(window_s)
                windows.append((frozen, start, time.time()))
        windows.append((False, time.time(), time.time() + window_s))
        time.sleep(window_s)
        run.terminate()
        run.wait()
        ledger = next((workdir / "runs").glob("*/ledger.jsonl"))
        steps = [r for r in read_ledger(ledger) if r["kind"] == "step"]
        end = list(read_ledger(ledger))[-1]

    def times(start: float, stop: float) -> list[float]:
        return [r["data_wait_s"] + r["compute_s"] for r in steps if start <= r["t"] < stop]

    print("round  p50 frozen/quiet  p99 frozen/quiet  steps in the frozen window")
    p50s, p99s = [], []
    for n in range(rounds):
        before, frozen, after = windows[2 * n], windows[2 * n + 1], windows[2 * n + 2]
        quiet = times(before[1], before[2]) + times(after[1], after[2])
        stalled = times(frozen[1], frozen[2])
        p50s.append(quantile(stalled, 0.5) / quantile(quiet, 0.5))
        p99s.append(quantile(stalled, 0.99) / quantile(quiet, 0.99))
        print(f"{n:>5}  {p50s[-1]:>16.3f}  {p99s[-1]:>16.3f}  {len(stalled):>26}")
    print(f"median  {statistics.median(p50s):>15.3f}  {statistics.median(p99s):>16.3f}")
    print(f"the run dropped {end.get('dropped_viewers')} viewers and {end.get('dropped_records')} records")


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30000, help="long enough to outlast the stop")
    p.add_argument("--stop-s", type=float, default=10.0)
    p.add_argument("--within-run", action="store_true", help="alternate windows inside one run (less noise)")
    args = p.parse_args()
    if args.within_run:
        within_run(args.rounds, args.stop_s)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="tuiwatch-stall-") as tmp:
        for n in range(args.rounds):
            runs = {}
            for stalled in (False, True) if n % 2 == 0 else (True, False):
                work = Path(tmp) / f"{n}-{int(stalled)}"
                work.mkdir()
                runs[stalled] = train(work, args.steps, args.stop_s if stalled else None)
            (base, _), (with_viewer, end) = runs[False], runs[True]
            rows.append(
                (
                    quantile(with_viewer, 0.5) / quantile(base, 0.5),
                    quantile(with_viewer, 0.99) / quantile(base, 0.99),
                    end.get("dropped_viewers"),
                    end.get("dropped_records"),
                )
            )
    print("round  p50 with/without  p99 with/without  dropped viewers  dropped records")
    for n, (p50, p99, viewers, dropped) in enumerate(rows):
        print(f"{n:>5}  {p50:>16.3f}  {p99:>16.3f}  {viewers!s:>15}  {dropped!s:>15}")
    p50s, p99s = [r[0] for r in rows], [r[1] for r in rows]
    print(f"median  {statistics.median(p50s):>15.3f}  {statistics.median(p99s):>16.3f}")


if __name__ == "__main__":
    main()
