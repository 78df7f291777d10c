"""``tuiwatch report`` on a long ledger: wall time, CPU time and peak memory, streamed against held in memory.

Writes a 200,000-step ledger (the demo's step records, 64 sample ids each,
an eval every 1,000 steps), then runs, in fresh processes, alternating:
``tuiwatch report`` (streams the ledger) and the same summary over the
records held in a list first (what report did before issue 16). Prints
each one's median wall and CPU time and peak RSS, and their ratios, with the
load average (absolute times on a shared machine mean little).

    python bench/report_scale.py [--steps 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

HELD = """
import sys
from tuiwatch.analysis.report import as_text, summarize
from tuiwatch.ledger.reader import read_ledger
records = list(read_ledger(sys.argv[1]))  # every record in memory at once
print(as_text(summarize(records)))
"""


def write_ledger(path: Path, steps: int) -> None:
    with open(path, "wb") as f:
        f.write(orjson.dumps({"kind": "run", "t": 0.0, "name": "long", "run_id": "r"}) + b"\n")
        for i in range(steps):
            record = {
                "kind": "step", "t": i * 0.01, "step": i, "epoch": i // 1000, "loss": 2.0 / (1 + i / 5000),
                "lr": [0.1], "grad_norm": 0.5, "grad_norm_clipped": False, "param_norm": 7.2, "update_norm": None,
                "opt_step": i + 1, "batch_ids": list(range(i % 4000, i % 4000 + 64)), "batch_shape": [[64, 2], [64]],
                "tokens": None, "data_wait_s": 0.0007, "compute_s": 0.004, "examples_per_s": 13000.0,
                "mem_allocated": None, "mem_reserved": None, "mem_peak": None,
                "finite": {"batch": True, "forward": True, "loss": True, "grad": True, "param": True},
                "training": True,
            }  # fmt: skip
            f.write(orjson.dumps(record) + b"\n")
            if i % 1000 == 999:
                f.write(orjson.dumps({"kind": "eval", "t": i * 0.01, "step": i, "val_loss": 1.0}) + b"\n")
        f.write(orjson.dumps({"kind": "end", "t": steps * 0.01, "reason": "finished"}) + b"\n")


def measure(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one child process."""
    started = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, argv
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Path(tmp) / "ledger.jsonl"
        write_ledger(ledger, args.steps)
        size = ledger.stat().st_size
        runs: dict[str, list[tuple[float, float, float]]] = {"streamed": [], "held": []}
        for _ in range(args.rounds):
            runs["streamed"].append(measure([sys.executable, "-m", "tuiwatch", "report", str(ledger)]))
            runs["held"].append(measure([sys.executable, "-c", HELD, str(ledger)]))
    print(f"{args.steps:,}-step ledger, {size / 2**20:.0f} MiB; {args.rounds} alternating rounds each; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in runs.items()}
    for name, (wall, cpu, rss) in med.items():
        print(f"{name:<9} wall {wall:6.1f} s  CPU {cpu:6.1f} s  peak RSS {rss:6.0f} MiB")
    (ws, cs, rs), (wh, ch, rh) = med["streamed"], med["held"]
    print(f"streamed / held: wall x{ws / wh:.2f}, CPU x{cs / ch:.2f}, peak RSS x{rs / rh:.2f}")


if __name__ == "__main__":
    main()
