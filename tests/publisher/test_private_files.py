"""What a run writes is its user's alone: private modes, no write through a planted symlink (issue 17)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import tuiwatch
from tuiwatch import Watch
from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.checkpoints import CheckpointError, write_checkpoint
from tuiwatch.publisher.dumps import write_dump
from tuiwatch.publisher.run_record import shared_root_warning
from tuiwatch.wire.protocol import Command

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def run(run_root: Path) -> Watch:
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in watch.batches([(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))] * 3):
            loss = nn.functional.cross_entropy(model(torch.randn(4, 2)), torch.tensor([0, 1, 0, 1]))
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert watch.run_dir is not None
        run_dir = Directory.open(watch.run_dir)
        write_checkpoint(run_dir, 3, watch.checkpoint_state())
        write_dump(run_dir, step=3, reason="dump", alert=None, batch=torch.ones(2), batch_ids=[1, 2],
                   records=[], seed=None)  # fmt: skip
    return watch


def test_the_run_directory_and_every_file_in_it_are_private(run_root: Path, socket_dir: Path):
    os.umask(0o022)  # the usual default, under which they were 0755 / 0644
    watch = run(run_root)
    run_dir = watch.run_dir
    assert run_dir is not None
    assert mode(run_dir) == 0o700
    for path in run_dir.rglob("*"):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_a_team_can_ask_for_group_readable_runs(run_root: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUIWATCH_SHARE", "group")
    os.umask(0o022)
    run_dir = run(run_root).run_dir
    assert run_dir is not None
    assert mode(run_dir) == 0o750
    assert mode(run_dir / "ledger.jsonl") == 0o640


def test_another_user_cannot_read_the_ledger(run_root: Path, socket_dir: Path):
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    run_dir = run(run_root).run_dir
    assert run_dir is not None
    run_root.chmod(0o755)  # even through an open parent
    out = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat", str(run_dir / "ledger.jsonl")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "Permission denied" in out.stderr
    assert out.stdout == ""


def test_a_symlinked_checkpoints_or_dumps_directory_is_refused(tmp_path: Path):
    run_dir, victim = tmp_path / "run", tmp_path / "victim"
    run_dir.mkdir()
    victim.mkdir()
    (run_dir / "checkpoints").symlink_to(victim)
    (run_dir / "dumps").symlink_to(victim)
    held = Directory.open(run_dir)
    with pytest.raises(CheckpointError, match="is a symlink or not a directory"):
        write_checkpoint(held, 1, {"w": torch.ones(1)})
    with pytest.raises(OSError, match="is a symlink or not a directory"):
        write_dump(held, step=1, reason="dump", alert=None, batch=None, batch_ids=None, records=[], seed=None)
    assert list(victim.iterdir()) == []


def test_a_symlink_planted_on_the_checkpoint_temp_file_is_not_written_through(tmp_path: Path):
    directory = tmp_path / "checkpoints"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    tmp = directory / f".tmp-step-1.pt-{os.getpid()}"
    # The stale-temp sweep runs first; a symlink raced in after it must still not be followed.
    real_remove = Directory.remove

    def remove_then_plant(self: Directory, name: str) -> None:
        real_remove(self, name)
        if name == tmp.name:
            tmp.symlink_to(victim)

    tmp.symlink_to(victim)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Directory, "remove", remove_then_plant)
        with pytest.raises(CheckpointError, match="cannot write"):
            write_checkpoint(Directory.open(tmp_path), 1, {"w": torch.ones(1)})
    assert victim.read_text() == "the user's own file"


def test_a_run_directory_renamed_and_replaced_mid_run_still_gets_its_writes(run_root: Path, socket_dir: Path):
    victim = run_root.parent / "victim"
    victim.mkdir()
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, opt, run_dir=run_root, system=False, quiet=True)
    assert watch.run_dir is not None
    moved = watch.run_dir.with_name("moved")
    # Whoever owns a shared root swaps the run's directory for a symlink to one of the user's own.
    os.rename(watch.run_dir, moved)
    watch.run_dir.symlink_to(victim)
    assert watch._commands.on_command(Command("checkpoint", 1)) is None
    for x in watch.batches([torch.randn(4, 2)] * 2):
        loss = model(x).pow(2).mean()
        watch.log(loss=loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    watch.close()
    assert list(victim.iterdir()) == []  # nothing followed the name
    reply = next(r for r in tuiwatch.read_ledger(moved) if r["kind"] == "action")
    assert reply["ok"], reply
    step = reply["steps_done"]
    assert reply["path"] == str(moved / "checkpoints" / f"step-{step}.pt")  # where it really is, not the old name
    assert Path(reply["dump"]).parent == moved / "dumps"
    assert tuiwatch.load_dump(reply["path"]).step == step


def test_a_run_dir_others_can_swap_gets_a_one_line_warning(tmp_path: Path):
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o777)
    assert shared_root_warning(shared) == (
        f"run_dir {shared} is writable by every user without the sticky bit: use a directory of your own"
    )
    shared.chmod(0o1777)  # /tmp-like: others cannot rename what is ours
    assert shared_root_warning(shared) is None
    shared.chmod(0o755)
    assert shared_root_warning(shared) is None
