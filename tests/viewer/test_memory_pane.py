"""The memory & devices pane: bars against the device total, NVML readings, the CPU side, from made-up GPU ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tuiwatch.analysis.format import size_of
from tuiwatch.viewer.panes.memory import MemoryPane, bar
from tuiwatch.viewer.sources import FileSource
from tuiwatch.viewer.views import device_total

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, until, write_ledger

GiB = 1 << 30


def test_the_device_total_comes_from_the_run_record_else_from_nvml():
    gpus = [
        {"index": 5, "device": "cuda:1", "mem_total": 40 * GiB},
        {"index": 2, "device": "cuda:0", "mem_total": 80 * GiB},
    ]
    assert device_total({"mem_total": 141 * GiB, "device": "cuda:1"}, gpus) == 141 * GiB
    assert device_total({"device": "cuda:1"}, gpus) == 40 * GiB  # by CUDA's name, whatever NVML's index
    assert device_total({"device": "cuda"}, gpus) == 80 * GiB
    assert device_total({"device": "cpu"}, gpus) is None
    assert device_total({"device": "cuda:7"}, gpus) is None
    assert device_total({"device": "cuda:0", "mem_total": "huge"}, None) is None


def test_narrow_bars_keep_their_cells_and_drop_the_byte_count():
    wide, narrow = bar("peak", 76 * GiB, 80 * GiB, 60).plain, bar("peak", 76 * GiB, 80 * GiB, 28).plain
    assert wide.endswith("░  95%  76.0 GiB")
    assert len(wide) == 60
    assert narrow.endswith("░  95%")
    assert len(narrow) == 28
    assert size_of(1536 << 20, 2 * GiB) == "1.5/2.0 GiB"
    assert size_of(None, 2 * GiB) == "-/2.0 GiB"


def _gpu_ledger(path: Path) -> Path:
    """A CUDA run's ledger as this machine cannot make one (no NVIDIA GPU here)."""
    records: list[dict[str, Any]] = [
        {"kind": "run", "t": 1.0, "name": "gpu-run", "host": "h", "device": "cuda:0", "mem_total": 80 * GiB},
    ]
    for i in range(30):
        records.append(
            {
                "kind": "step",
                "t": 2.0 + i,
                "step": i,
                "loss": 1.0,
                "lr": [0.1],
                "mem_allocated": (10 + i) * GiB,
                "mem_reserved": 70 * GiB,
                "mem_peak": 76 * GiB,
            }
        )
    records.append(
        {
            "kind": "system",
            "t": 40.0,
            "cpu_percent": 101.0,
            "rss": 3 * GiB,
            "workers": 4,
            "workers_cpu_percent": [30.0, 25.0, 20.0, 15.0],
            "gpus": [
                {
                    "index": 0,
                    "device": "cuda:0",
                    "util": 97,
                    "mem_used": 72 * GiB,
                    "mem_total": 80 * GiB,
                    "temp": 65,
                    "power": 301.4,
                    "process_mem_used": 71 * GiB,
                }
            ],
        }
    )
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


async def test_the_pane_draws_memory_bars_against_the_device_total_and_the_gpu_readings(tmp_path: Path):
    app = RecordingApp(FileSource(_gpu_ledger(tmp_path / "ledger.jsonl")), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.state.step == 29 and bool(app.state.last_system))
        await drawn(pilot)
        lines = plain(app.query_one(MemoryPane)).splitlines()
    bars = {line.split()[0]: line for line in lines[:3]}
    assert set(bars) == {"allocated", "reserved", "peak"}
    assert bars["allocated"].rstrip().endswith("49%  39.0 GiB")  # 39 of 80 GiB
    assert bars["reserved"].rstrip().endswith("88%  70.0 GiB")
    assert bars["peak"].rstrip().endswith("95%  76.0 GiB")
    filled = [line.count("█") for line in lines[:3]]
    assert filled[0] < filled[1] < filled[2]
    assert lines[3] == "of 80.0 GiB on cuda:0"
    assert lines[4] == "gpu0 97%  mem 72.0/80.0 GiB (run 71.0 GiB)  65°C  301W"
    assert lines[5] == "cpu 101%  rss 3.0 GiB  workers 4 (90% cpu)"
    assert lines[6] == "allocated over steps"
    assert len(lines) > 7  # the chart


async def test_without_nvml_the_pane_says_why_and_shows_the_cpu_side(tmp_path: Path):
    records = [
        {"kind": "run", "t": 1.0, "name": "cpu-run", "host": "h", "device": "cpu"},
        {"kind": "step", "t": 2.0, "step": 0, "loss": 1.0, "mem_allocated": None},
        {
            "kind": "system",
            "t": 3.0,
            "cpu_percent": 99.0,
            "rss": 512 << 20,
            "workers": 0,
            "workers_cpu_percent": [],
            "gpus": None,
            "gpu_error": "NVML unavailable (NVML Shared Library Not Found)",
        },
    ]
    path = write_ledger(tmp_path / "ledger.jsonl", records)
    app = RecordingApp(FileSource(path), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: bool(app.state.last_system))
        await drawn(pilot)
        lines = plain(app.query_one(MemoryPane)).splitlines()
    assert lines[:3] == [
        "no GPU: NVML unavailable (NVML Shared Library Not Found)",
        "cpu 99%  rss 512.0 MiB  workers 0",
        "rss over steps",
    ]
