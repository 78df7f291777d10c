"""Half-written checkpoints and dumps of killed runs are swept, with what they freed (issue 17, item 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tuiwatch.ledger.litter import sweep_stale_temps


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (pids are not reused this soon)


def test_the_temporaries_of_dead_runs_go_and_a_live_runs_stay(tmp_path: Path):
    dead, live = dead_pid(), os.getpid()
    checkpoints, dumps = tmp_path / "a-run" / "checkpoints", tmp_path / "b-run" / "dumps"
    checkpoints.mkdir(parents=True)
    dumps.mkdir(parents=True)
    (checkpoints / f".tmp-step-40.pt-{dead}").write_bytes(b"x" * 5000)
    (checkpoints / f".tmp-step-80.pt-{live}").write_bytes(b"y" * 10)  # being written now
    (checkpoints / "step-20.pt").write_bytes(b"z" * 10)  # a finished checkpoint: never touched
    half = dumps / f".tmp-50-loss-spike-{dead}"
    half.mkdir()
    (half / "batch.pt").write_bytes(b"b" * 3000)
    assert sweep_stale_temps(tmp_path) == (2, 8000)
    assert sorted(p.name for p in checkpoints.iterdir()) == [f".tmp-step-80.pt-{live}", "step-20.pt"]
    assert list(dumps.iterdir()) == []
    assert sweep_stale_temps(tmp_path) == (0, 0)


def test_the_sweep_never_follows_a_symlink_planted_in_the_root(tmp_path: Path):
    dead = dead_pid()
    root, elsewhere = tmp_path / "shared-runs", tmp_path / "home"
    (elsewhere / "checkpoints").mkdir(parents=True)
    keep = elsewhere / "checkpoints" / f".tmp-thesis-{dead}"  # a name like ours, in the user's own files
    keep.write_text("the user's own file")
    root.mkdir()
    (root / "planted-run").symlink_to(elsewhere)  # the run directory is a symlink
    (root / "real-run").mkdir()
    (root / "real-run" / "dumps").symlink_to(elsewhere / "checkpoints")  # or its dumps/ is
    assert sweep_stale_temps(root) == (0, 0)
    assert keep.read_text() == "the user's own file"
