"""A checkpoint is all or nothing: SIGKILL at any moment of a write never leaves a truncated file."""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.checkpoints import FORMAT, CheckpointError, load_checkpoint, write_checkpoint

pytestmark = pytest.mark.integration  # checkpoints of real trainings, some killed mid-write

MB = 1 << 20
SIZE_MB = 8  # large enough that a write takes several ms: the kills land inside writes


def state(step: int, size_mb: int = SIZE_MB, weight: torch.Tensor | None = None) -> dict[str, Any]:
    """A checkpoint whose weights hold step // 1000 (the round that wrote it)."""
    if weight is None:
        weight = torch.full((size_mb * MB // 4,), float(step // 1000))
    return {
        "tuiwatch_checkpoint": FORMAT,
        "step": step,
        "epoch": 0,
        "batch_index": step,
        "opt_steps": step,
        "model": {"w": weight},
        "rng": {},
        "versions": {},
    }


def check_all(directory: Path) -> list[int]:
    """Every checkpoint under a final name loads whole and holds what its name says."""
    steps = []
    for path in sorted(directory.glob("step-*.pt")):
        ckpt = load_checkpoint(path)
        assert path.name == f"step-{ckpt.step}.pt"
        weight = ckpt.model["w"]
        assert weight.numel() == SIZE_MB * MB // 4
        assert bool((weight == ckpt.step // 1000).all())
        steps.append(ckpt.step)
    return steps


def writer(run_dir: Directory, first: int, weight: torch.Tensor) -> None:
    """In a forked child: write checkpoints back to back until killed.

    The weights were made before the fork: a forked child must not start
    torch's thread pool (OpenMP does not survive fork); saving does not use it.
    """
    step = first
    while True:
        write_checkpoint(run_dir, step, state(step, weight=weight))
        step += 1


def test_sigkill_during_checkpoint_writes_never_leaves_a_truncated_checkpoint(tmp_path: Path):
    directory, run_dir = tmp_path / "checkpoints", Directory.open(tmp_path)
    write_checkpoint(run_dir, 0, state(0))
    rng = random.Random(0)  # noqa: S311 - the moments of the kills, not secrets
    killed_mid_write = 0
    for round_ in range(1, 51):
        weight = torch.full((SIZE_MB * MB // 4,), float(round_))
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                writer(run_dir, 1000 * round_, weight)
            finally:
                os._exit(1)
        # The delay is the moment of the kill, chosen at random: a write takes tens of ms.
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        killed_mid_write += any(directory.glob(".tmp-*"))
        steps = check_all(directory)
        assert 0 in steps  # the first checkpoint is always there, whole
    assert killed_mid_write >= 10  # the kills did land inside writes
    # The next write cleans up what the killed ones left.
    write_checkpoint(run_dir, 99_999, state(1))
    assert not list(directory.glob(".tmp-*"))


def test_a_write_that_fails_midway_leaves_the_old_checkpoints_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    directory, run_dir = tmp_path / "checkpoints", Directory.open(tmp_path)
    write_checkpoint(run_dir, 1, state(1, size_mb=1))

    def full_disk(obj: Any, f: Any) -> None:
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoints are intact"):
        write_checkpoint(run_dir, 2, state(2, size_mb=1))
    assert sorted(p.name for p in directory.iterdir()) == ["step-1.pt"]
    assert load_checkpoint(directory / "step-1.pt").step == 1
