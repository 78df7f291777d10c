"""What a multi-rank job costs the viewer, measured in one run and printed as tables.

1. The fold of a job's records (``RanksState.apply``: each rank's row, the
   straggler rule over every rank, the lead rank's records picked out) per
   record, for 2, 8 and 64 ranks, against ``RunState.apply`` of the same
   records as one run: thread CPU time, the ratio side by side.
2. The ranks pane's view of 64 ranks (summary and outliers), per redraw.
3. A headless replay of an 8-rank job directory (5,000 steps a rank) against
   one ledger of the same 40,000 step records: CPU time and wall time to the
   last record shown.

    python bench/viewer_ranks.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

from tuiwatch.cli.replay import replay_source
from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.ranks import RanksState
from tuiwatch.viewer.sources import FileSource, Source
from tuiwatch.viewer.state import RunState
from tuiwatch.viewer.views import ranks_view


def step(n: int, rank: int) -> dict[str, Any]:
    slow = rank == 1
    return {
        "kind": "step",
        "t": 1000.0 + n,
        "step": n,
        "epoch": 0,
        "loss": 1.0 / (1 + n * 1e-3),
        "lr": [0.1],
        "grad_norm": 1.0 + (n % 7) * 0.1,
        "data_wait_s": 0.021 if slow else 0.001,
        "compute_s": 0.03,
        "forward_s": 0.002,
        "backward_s": 0.004 if slow else 0.024,
        "optimizer_s": 0.001,
    }


def run_record(rank: int, world: int) -> dict[str, Any]:
    return {"kind": "run", "t": 1000.0, "name": "job", "run_id": "b", "rank": rank, "world_size": world, "pid": 1}


def fold_cost(ranks: int, steps: int) -> tuple[float, float]:
    """µs of thread CPU a record: the job's fold, and one RunState folding the same records."""
    starts = range(0, steps, 50)  # records come in batches of 50 steps, each rank's in turn
    batches = {r: [[step(n, r) for n in range(i, min(i + 50, steps))] for i in starts] for r in range(ranks)}
    job = RanksState(range(ranks), ranks)
    state = RunState()
    t0 = time.thread_time()
    for b in range(len(starts)):
        for rank in range(ranks):
            state.apply_all(job.apply(rank, batches[rank][b], 0.0))
    job_s = time.thread_time() - t0
    one = RunState()
    t0 = time.thread_time()
    for b in range(len(starts)):
        for rank in range(ranks):
            one.apply_all(batches[rank][b])
    one_s = time.thread_time() - t0
    n = ranks * steps
    return job_s / n * 1e6, one_s / n * 1e6


def memory_of(ranks: int, steps: int) -> float:
    """MiB a job's fold holds after ``steps`` steps of every rank (its per-rank series are bounded)."""
    tracemalloc.start()
    job = RanksState(range(ranks), ranks)
    for start in range(0, steps, 500):
        for rank in range(ranks):
            job.apply(rank, [step(n, rank) for n in range(start, start + 500)], 0.0)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held / (1 << 20)


def view_cost(ranks: int, rounds: int = 200) -> float:
    job = RanksState(range(ranks), ranks)
    for rank in range(ranks):
        job.connected(rank)
        job.apply(rank, [step(n, rank) for n in range(30)], 0.0)
    t0 = time.thread_time()
    for _ in range(rounds):
        ranks_view(job, 1.0)
    return (time.thread_time() - t0) / rounds * 1e6


def write_job(root: Path, ranks: int, steps: int) -> tuple[Path, Path]:
    job = root / "job"
    for rank in range(ranks):
        (job / f"rank{rank}").mkdir(parents=True)
        records = [run_record(rank, ranks)] + [step(n, rank) for n in range(steps)]
        (job / f"rank{rank}" / "ledger.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    single = root / "single.jsonl"
    flat = [run_record(0, 1)] + [step(n, 0) for n in range(steps * ranks)]
    single.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in flat))
    return job, single


async def replay(source: Source) -> tuple[float, float]:
    app = TuiwatchApp(source)
    w0, c0 = time.perf_counter(), time.process_time()
    async with app.run_test(size=(160, 48)) as pilot:
        while app.loading is not None or app.state.status in ("connecting", "live"):
            await pilot.pause(0.01)
        app.redraw(force=True)
        await pilot.pause()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print("\n| ranks | job fold µs/record | one run's fold µs/record | ratio |\n|---|---|---|---|")
    for ranks in (2, 8, 64):
        rounds = [fold_cost(ranks, args.steps if ranks < 64 else args.steps // 4) for _ in range(3)]
        job = statistics.median(r[0] for r in rounds)
        one = statistics.median(r[1] for r in rounds)
        print(f"| {ranks} | {job:.2f} | {one:.2f} | {job / one:.2f}× |")
    print(f"\nranks pane view of 64 ranks (summary and outliers): {view_cost(64):.0f} µs a redraw")
    for steps in (2_000, 20_000):
        print(f"the fold of 64 ranks after {steps:,} steps each holds {memory_of(64, steps):.1f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        job, single = write_job(Path(tmp), 8, 5000)
        rows = []
        for _ in range(3):
            rows.append((asyncio.run(replay(replay_source(str(job)))), asyncio.run(replay(FileSource(single)))))
        jw = statistics.median(r[0][0] for r in rows)
        jc = statistics.median(r[0][1] for r in rows)
        sw = statistics.median(r[1][0] for r in rows)
        sc = statistics.median(r[1][1] for r in rows)
    print("\n| replay of 40,000 step records | wall s | CPU s |\n|---|---|---|")
    print(f"| an 8-rank job directory (5,000 a rank) | {jw:.2f} | {jc:.2f} |")
    print(f"| one ledger | {sw:.2f} | {sc:.2f} |")
    print(f"| ratio | {jw / sw:.2f}× | {jc / sc:.2f}× |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
