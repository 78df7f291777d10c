"""A real torchrun job (gloo, 2 CPU ranks) seen as one run: one row in ``ls``, both ranks in the viewer, and
``c`` and ``s`` acting on every rank at one step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tuiwatch.ledger.ranks import rank_ledgers
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.viewer.app import APART_PAUSE
from tuiwatch.viewer.panes.ranks import RanksPane
from tuiwatch.viewer.screens.confirm_stop import ConfirmStop
from tuiwatch.viewer.sources import RanksSource
from tuiwatch.wire.discovery import LiveJob, group_jobs, list_live_runs

from ..helpers import SCRIPTS, STARTED, env_for, kill_tree, start_training, wait_until
from ..viewer_helpers import RecordingApp, drawn, plain, ranks_stepping, until

pytestmark = pytest.mark.integration


def start_job(run_root: Path, socket_dir: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPTS / "ddp_train.py")]
    args = ["--run-dir", str(run_root), "--epochs", "1000", "--step-sleep", "0.01", *extra]
    proc = subprocess.Popen(
        [*cmd, *args], env=env_for(socket_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    STARTED.append(proc)
    return proc


def live_job(socket_dir: Path) -> LiveJob | None:
    found = group_jobs(list_live_runs(socket_dir))
    job = found[0] if len(found) == 1 else None
    return job if isinstance(job, LiveJob) and len(job.ranks) == 2 else None


def viewer_of(job: LiveJob) -> RecordingApp:
    return RecordingApp(
        RanksSource.on_this_host(job.name, job.world_size, {r.rank or 0: Path(r.socket) for r in job.ranks})
    )


async def test_a_torchrun_job_is_one_run_in_ls_and_the_viewer_and_c_and_s_reach_every_rank_at_one_step(
    tmp_path: Path, socket_dir: Path
):
    proc = start_job(tmp_path / "runs", socket_dir)
    job = wait_until(lambda: live_job(socket_dir), timeout=60, what="both ranks listening")

    listed = subprocess.run(
        [sys.executable, "-m", "tuiwatch", "ls"], env=env_for(socket_dir), capture_output=True, text=True, timeout=60
    )
    rows = listed.stdout.splitlines()
    assert len(rows) == 2, listed.stdout  # the header and ONE row for the job
    assert rows[1].split()[0] == "ddp"
    assert "ranks 2/2" in rows[1]
    assert ",".join(str(r.pid) for r in job.ranks) in rows[1]

    app = viewer_of(job)
    async with app.run_test(size=(140, 40)) as pilot:
        ranks = await ranks_stepping(pilot, app)
        await drawn(pilot)
        pane = plain(app.query_one(RanksPane)).splitlines()
        # 140 columns: the side column has room for the short table but its hosts; a wider terminal adds them.
        assert pane[0].split() == ["#", "state", "wait", "sync", "step", "time", "mem"]
        assert [line.split()[:2] for line in pane[1:3]] == [["0", "live"], ["1", "live"]]

        await pilot.press("c")
        await until(pilot, lambda: any("checkpoint written" in n for n in app.notes), 60, "the checkpoints")
        (said,) = [n for n in app.notes if "checkpoint written" in n]
        assert said.startswith("2 ranks after step ")
        await pilot.press("p")
        await until(pilot, lambda: all(s.paused for s in ranks.ranks.values()), 60, "both ranks paused")
        (paused,) = [n for n in app.notes if "paused after step" in n]
        assert paused.startswith("2 ranks after step ")
        assert app.state.status == "paused"
        held = [s.step or 0 for s in ranks.ranks.values()]
        await pilot.press("p")  # resume: both go on
        await until(pilot, lambda: app.state.status == "live", 60, "the job resumed")
        await until(
            pilot, lambda: all((s.step or 0) > h + 2 for s, h in zip(ranks.ranks.values(), held, strict=True)), 60
        )
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmStop)
        await pilot.press("y")
        await until(
            pilot, lambda: any("ranks after step" in n and "stop requested" in n for n in app.notes), 60, "the stop"
        )
        await until(pilot, lambda: all(s.end_reason for s in ranks.ranks.values()), 60, "both ranks to end")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]

    (job_dir,) = (tmp_path / "runs").iterdir()
    ledgers = rank_ledgers(job_dir)
    actions = {rank: [r for r in read_ledger(path) if r["kind"] == "action"] for rank, path in ledgers.items()}
    # Each rank ran the checkpoint and the stop after the same step as the other.
    checkpoint = {rank: next(a for a in acts if a["action"] == "checkpoint") for rank, acts in actions.items()}
    stop = {rank: next(a for a in acts if a["action"] == "stop") for rank, acts in actions.items()}
    pause = {rank: next(a for a in acts if a["action"] == "pause") for rank, acts in actions.items()}
    assert checkpoint[0]["step"] == checkpoint[1]["step"]
    assert pause[0]["step"] == pause[1]["step"]
    assert stop[0]["step"] == stop[1]["step"]
    for rank in (0, 1):
        assert Path(checkpoint[rank]["path"]).is_file()
        assert f"rank{rank}" in checkpoint[rank]["path"]
    ends = {rank: [r for r in read_ledger(path) if r["kind"] == "end"] for rank, path in ledgers.items()}
    assert [e["reason"] for e in ends[0] + ends[1]] == ["stopped", "stopped"]
    steps = {rank: [r["step"] for r in read_ledger(path) if r["kind"] == "step"] for rank, path in ledgers.items()}
    assert steps[0][-1] == steps[1][-1]


async def test_the_live_viewer_names_a_rank_with_a_slow_loader_as_the_straggler(tmp_path: Path, socket_dir: Path):
    proc = start_job(tmp_path / "runs", socket_dir, "--slow-rank", "1", "--slow-s", "0.02")
    job = wait_until(lambda: live_job(socket_dir), timeout=60, what="both ranks listening")
    app = viewer_of(job)
    async with app.run_test(size=(140, 40)) as pilot:
        ranks = await ranks_stepping(pilot, app)
        await until(pilot, lambda: ranks.waited_for is not None, 60, "the straggler named")
        (alert,) = [a for a in app.state.alerts if a.rule == "straggler"]
        assert (alert.rank, alert.severity) == (1, "warning")
        assert alert.message.endswith("(input)")
        assert alert.step is not None
        assert alert.step < 60  # judged within a bounded number of steps (20 to fill, every 10 after)
        await drawn(pilot)
        rows = plain(app.query_one(RanksPane)).splitlines()
        assert rows[2].split()[0] == "»1"
    kill_tree(proc)


async def test_a_rank_killed_mid_run_is_shown_gone_and_leaves_a_clean_ledger(tmp_path: Path, socket_dir: Path):
    proc = start_job(tmp_path / "runs", socket_dir)
    job = wait_until(lambda: live_job(socket_dir), timeout=60, what="both ranks listening")
    app = viewer_of(job)
    async with app.run_test(size=(160, 40)) as pilot:
        ranks = await ranks_stepping(pilot, app)
        os.kill(job.ranks[1].pid, signal.SIGKILL)
        await until(pilot, lambda: ranks.ranks[1].status(time.time()) == "gone", 30, "rank 1 shown gone")
        await drawn(pilot)
        rows = plain(app.query_one(RanksPane)).splitlines()
        assert rows[2].split()[:2] == ["1", "gone"]
        assert any(n.startswith("rank 1: ") for n in app.notes)  # said, with the reason, once
        # torchrun then ends the job: rank 0 is told to stop, and says so in its own row.
        await until(pilot, lambda: ranks.ranks[0].status(time.time()) != "live", 60, "rank 0 to end")
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    (job_dir,) = (tmp_path / "runs").iterdir()
    killed = rank_ledgers(job_dir)[1].read_bytes()
    assert killed.endswith(b"\n")
    lines = [orjson.loads(line) for line in killed.splitlines()]  # every line whole: a clean prefix
    assert lines[0]["kind"] == "run"
    assert "end" not in {r["kind"] for r in lines}


async def test_ranks_that_pause_at_different_steps_are_resumed_at_once(tmp_path: Path, socket_dir: Path):
    # Two processes that say they are ranks 0 and 1 of one job (torchrun's variables), stepping at different
    # speeds and never synchronising: a command that reaches them after its step runs at each one's next
    # boundary, at different steps, as it would on a DDP job whose records reached the viewer late.
    procs = []
    for rank, pace in ((0, "0.005"), (1, "0.02")):
        with pytest.MonkeyPatch.context() as env:
            for key, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", 2)):
                env.setenv(key, str(value))
            env.setenv("TORCHELASTIC_RUN_ID", "apart")
            args = ("--name", "apart", "--steps", "100000", "--step-sleep", pace)
            procs.append(start_training(tmp_path / "runs", socket_dir, *args))
    job = wait_until(lambda: live_job(socket_dir), timeout=60, what="both ranks listening")
    app = viewer_of(job)
    async with app.run_test(size=(140, 40)) as pilot:
        ranks = await ranks_stepping(pilot, app, past=40)
        # The viewer's view of the ranks is late: the step it picks is behind both (records still arriving must
        # not move it, as they would move a step picked from the ranks' rows).
        ranks.command_step = lambda lead_s=1.0: 2  # type: ignore[method-assign]
        await pilot.press("p")
        await until(pilot, lambda: any("NOT at one step" in n for n in app.notes), 30, "the pause, apart")
        assert APART_PAUSE in app.notes
        await until(pilot, lambda: any("resume done" in n for n in app.notes), 30, "the resume of both ranks")
        assert app.state.status == "live"
        held = {rank: s.step or 0 for rank, s in ranks.ranks.items()}
        await until(pilot, lambda: all((s.step or 0) > held[r] + 2 for r, s in ranks.ranks.items()), 30)
    for proc in procs:
        proc.kill()
        proc.wait(10)
    (job_dir,) = (tmp_path / "runs").iterdir()
    for path in rank_ledgers(job_dir).values():
        assert [r["action"] for r in read_ledger(path) if r["kind"] == "action"] == ["pause", "resume"]
