"""How fast the viewer is, measured in one run and printed as a table.

1. cold start: a fresh interpreter imports the attach path, connects to a live
   socket and paints its first frame (headless);
2. sustained ingest: a producer process sends step records at a fixed rate
   over a real Unix socket; the viewer (headless, in this process) must keep
   up, with latency from send to fold bounded, and handle a key press;
3. one chart drawn from a 1,000,000-step series;
4. the metrics view (``m``) of a 1,000,000-step run logging 30 metrics: a page
   of its grid at 200x60 drawn, per chart and whole, and the memory of the fold;
5. RSS of a process that replayed a 1,000,000-step ledger.

    python bench/viewer.py [--rate 10000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from rich.style import Style

from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.render.chart import Trace, chart
from tuiwatch.viewer.render.series import Series
from tuiwatch.viewer.sources import SocketSource

RUN = {"kind": "run", "t": 0.0, "name": "bench", "run_id": "bench", "host": "local", "pid": 1}


def step_record(step: int) -> bytes:
    return (
        orjson.dumps(
            {
                "kind": "step",
                "t": time.time(),
                "step": step,
                "epoch": 0,
                "loss": 1.0 / (1 + step * 1e-3),
                "lr": [0.1],
                "grad_norm": 1.0 + (step % 7) * 0.1,
                "data_wait_s": 1e-4,
                "compute_s": 1e-3,
            }
        )
        + b"\n"
    )


def produce(path: str, rate: int, seconds: float, ready: Any) -> None:
    """A stand-in publisher: one client, records at ``rate`` per second, batched every 10 ms."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    ready.set()
    conn, _ = server.accept()
    # The viewer may go away first: the cold-start check exits after one frame.
    with contextlib.suppress(BrokenPipeError):
        _stream(conn, rate, seconds)
    conn.close()


def _stream(conn: socket.socket, rate: int, seconds: float) -> None:
    conn.sendall(orjson.dumps(RUN) + b"\n")
    start = time.monotonic()
    step = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        if due > step:
            conn.sendall(b"".join(step_record(s) for s in range(step, due)))
            step = due
        time.sleep(0.01)  # pacing the producer, not synchronising
    conn.sendall(orjson.dumps({"kind": "end", "t": time.time(), "reason": "finished"}) + b"\n")


COLD = """
import sys, time
from pathlib import Path
from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.sources import SocketSource
class Once(TuiwatchApp):
    def on_mount(self):
        super().on_mount()
        self.call_after_refresh(lambda: self.exit())
Once(SocketSource(Path(sys.argv[1]), None)).run(headless=True)
"""


def cold_start(tmp: Path) -> list[float]:
    times = []
    for i in range(5):
        path = str(tmp / f"cold{i}.sock")
        ready = multiprocessing.Event()
        proc = multiprocessing.Process(target=produce, args=(path, 100, 2.0, ready))
        proc.start()
        ready.wait(10)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", COLD, path], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
        proc.terminate()
        proc.join()
    return times


class Timed(TuiwatchApp):
    """Records how old each record is when it is folded."""

    lags: list[float]

    def on_records_received(self, message: Any) -> None:
        now = time.time()
        for r in message.records:
            if r.get("kind") == "step":
                self.lags.append(now - r["t"])
        super().on_records_received(message)


async def ingest(tmp: Path, rate: int, seconds: float) -> dict[str, float]:
    path = str(tmp / "ingest.sock")
    ready = multiprocessing.Event()
    proc = multiprocessing.Process(target=produce, args=(path, rate, seconds, ready))
    proc.start()
    ready.wait(10)
    app = Timed(SocketSource(Path(path), None))
    app.lags = []
    key_ms: list[float] = []
    async with app.run_test(size=(120, 36)):
        deadline = time.monotonic() + seconds + 30
        while app.state.status != "finished" and time.monotonic() < deadline:
            # A key event posted as the terminal driver would, timed until its action ran
            # (pilot.press would also wait for the app to go idle, which a flooded app never is).
            t0 = time.perf_counter()
            before = app.window_index
            app.simulate_key("w")
            while app.window_index == before:
                await asyncio.sleep(0.001)
            key_ms.append((time.perf_counter() - t0) * 1e3)
            await asyncio.sleep(0.5)
        received = app.state.metrics["loss"].count if "loss" in app.state.metrics else 0
        sent = (app.state.step or 0) + 1
    proc.join()
    lags = sorted(app.lags)
    return {
        "records": received,
        "expected": sent,
        "lag_p50_ms": lags[len(lags) // 2] * 1e3,
        "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1e3,
        "lag_last_s_p99_ms": sorted(lags[-rate:])[int(min(rate, len(lags)) * 0.99) - 1] * 1e3,
        "key_p50_ms": statistics.median(key_ms),
        "key_max_ms": max(key_ms),
    }


def chart_time() -> float:
    series = Series()
    for step in range(1_000_000):
        series.add(step, 1.0 / (1 + step * 1e-4))
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        chart([Trace(series, Style(color="cyan"))], 100, 10, None)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def grid_time(steps: int, metrics: int = 30) -> tuple[float, float, int, float]:
    """A page of the metrics view of ``steps`` steps of ``metrics`` logged metrics at 200x60: ms a chart, ms the
    page (the view built and every chart of the page drawn), charts on the page, MiB the fold grew by."""
    import psutil

    from tuiwatch.viewer.panes.metrics import CELL_HEIGHT, GAP, grid_shape, layout
    from tuiwatch.viewer.state import RunState
    from tuiwatch.viewer.views import metrics_view

    rss0 = psutil.Process().memory_info().rss
    state = RunState()
    names = [f"metric_{i:02d}" for i in range(metrics)]
    for step in range(steps):
        state.apply(
            {
                "kind": "step",
                "step": step,
                "lr": [0.1],
                "grad_norm": 1.0 / (1 + step),
                **dict.fromkeys(names, step * 1e-3),
            }
        )
    grown = (psutil.Process().memory_info().rss - rss0) / 2**20
    columns, _ = grid_shape(200 - 4, 60 - 4)
    width = (196 - GAP * (columns - 1)) // columns
    page: list[float] = []
    for _ in range(10):
        t0 = time.perf_counter()
        view = metrics_view(state, None)
        cells = [c for band in layout(view.cells, 196, 56)[0] for c in band if not c.constant]  # as the pane draws
        for cell in cells:
            traces = [Trace(line.series, Style(color="cyan"), line.markers) for line in cell.chart.lines]
            chart(traces, width, CELL_HEIGHT - 1, None, cell.chart.log, cell.chart.unit, cell.chart.span)
        page.append(time.perf_counter() - t0)
    whole = statistics.median(page)
    return whole / len(cells) * 1e3, whole * 1e3, len(cells), grown


REPLAY = """
import sys, psutil
from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.sources import FileSource
class Until(TuiwatchApp):
    def on_source_ended(self, message):
        super().on_source_ended(message)
        self.call_after_refresh(self.exit)
app = Until(FileSource(sys.argv[1]))
app.run(headless=True)
print(psutil.Process().memory_info().rss, app.state.step)
"""


def replay_rss(tmp: Path, steps: int) -> tuple[float, int, float]:
    path = tmp / "ledger.jsonl"
    with open(path, "wb") as f:
        f.write(orjson.dumps(RUN) + b"\n")
        for start in range(0, steps, 10_000):
            f.write(b"".join(step_record(s) for s in range(start, min(start + 10_000, steps))))
        f.write(orjson.dumps({"kind": "end", "t": time.time(), "reason": "finished"}) + b"\n")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", REPLAY, str(path)], check=True, capture_output=True, text=True)
    rss, last = out.stdout.split()
    return float(rss), int(last), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000, help="records per second (10000)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=1_000_000, help="steps in the replayed ledger")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tw-vb-", dir="/tmp"))
    os.chmod(tmp, 0o700)

    cold = cold_start(tmp)
    result = asyncio.run(ingest(tmp, args.rate, args.seconds))
    chart = chart_time()
    grid_chart_ms, grid_page_ms, grid_charts, grid_mib = grid_time(args.steps)
    rss, last, replay_s = replay_rss(tmp, args.steps)

    print(f"{'measure':<58} {'value':>14}  bar")
    print(f"{'cold start to first frame (median of 5)':<58} {statistics.median(cold) * 1e3:>11.0f} ms  < 1000 ms")
    print(
        f"{f'ingest at {args.rate:,}/s for {args.seconds:.0f}s: records folded':<58} "
        f"{result['records']:>14,}  of {result['expected']:,}"
    )
    print(f"{'  send-to-fold latency p50 / p99':<58} {result['lag_p50_ms']:>6.0f} / {result['lag_p99_ms']:<5.0f}ms")
    print(f"{'  latency p99 over the last second (no growing backlog)':<58} {result['lag_last_s_p99_ms']:>11.0f} ms")
    print(
        f"{'  key press handled, median / max':<58} "
        f"{result['key_p50_ms']:>6.0f} / {result['key_max_ms']:<5.0f}ms  < 100 ms"
    )
    print(f"{'one chart (100x10 cells) from a 1,000,000-step series':<58} {chart * 1e3:>11.2f} ms  <= 5 ms")
    print(
        f"{f'metrics view of {args.steps:,} steps x 30 metrics: a chart / the page of {grid_charts} at 200x60':<58} "
        f"{grid_chart_ms:>5.2f} / {grid_page_ms:<5.0f}ms  <= 5 ms a chart"
    )
    print(f"{'  the fold of those steps: memory it grew by':<58} {grid_mib:>10.0f} MiB  < 200 MB")
    print(
        f"{f'RSS after replaying {args.steps:,} steps (last step {last:,}, {replay_s:.0f} s)':<58} "
        f"{rss / 2**20:>10.0f} MiB  < 200 MB"
    )


if __name__ == "__main__":
    main()
