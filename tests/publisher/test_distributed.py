"""A real DDP job under torchrun (gloo, 2 CPU ranks): one job directory, rank-tagged ledgers, per-rank phases,
and a planted straggler named by rank and cause in the job's report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.ledger.ranks import merge_ranks, rank_ledgers
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record
from tuiwatch.viewer.ranks import RanksState
from tuiwatch.wire.discovery import LiveRun, list_live_runs
from tuiwatch.wire.protocol import command_line, connect, iter_records

from ..helpers import SCRIPTS, STARTED, env_for, wait_until

pytestmark = pytest.mark.integration


def torchrun(run_root: Path, socket_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPTS / "ddp_train.py")]
    done = subprocess.run(
        [*cmd, "--run-dir", str(run_root), *args], env=env_for(socket_dir), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def report(job: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tuiwatch", "report", "--json", str(job)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def test_a_torchrun_job_is_one_directory_of_rank_ledgers_with_phases(tmp_path: Path):
    done = torchrun(tmp_path / "runs", tmp_path / "sock")
    (job,) = (tmp_path / "runs").iterdir()
    ledgers = rank_ledgers(job)
    assert sorted(ledgers) == [0, 1]
    assert ledgers[0] == job / "rank0" / "ledger.jsonl"
    # One start line for the job on this host (local rank 0), naming the directory the ranks share.
    assert done.stderr.count("tuiwatch: ddp: 2 ranks, ledgers") == 1
    runs = {rank: next(iter(read_ledger(path))) for rank, path in ledgers.items()}
    assert {(r["rank"], r["local_rank"], r["world_size"]) for r in runs.values()} == {(0, 0, 2), (1, 1, 2)}
    assert [r["sharded"] for r in runs.values()] == [False, False]  # DDP: every rank holds the whole model
    assert runs[0]["run_id"] == runs[1]["run_id"]
    assert job.name == f"ddp-{runs[0]['run_id']}"[:44]
    for path in ledgers.values():
        steps = [r for r in read_ledger(path) if r["kind"] == "step"]
        assert [s["step"] for s in steps] == list(range(64))  # 2 epochs of 1,024 samples / 32 per batch, each rank
        for s in steps:
            assert s["forward_s"] > 0
            assert s["backward_s"] > 0
            assert s["optimizer_s"] > 0
            assert s["forward_s"] + s["backward_s"] + s["optimizer_s"] <= s["compute_s"] + 1e-6
    merged = [r for r in merge_ranks({k: read_ledger(p) for k, p in ledgers.items()}) if r["kind"] == "step"]
    assert [(r["step"], r["rank"]) for r in merged[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    summary = report(job)
    assert summary["world_size"] == 2
    assert [r["steps"] for r in summary["ranks"]] == [64, 64]
    assert "straggler" not in summary["alerts"]  # healthy ranks: nobody waits for anybody


def test_a_slow_loader_on_rank_1_is_named_as_the_straggler_by_its_input(tmp_path: Path):
    torchrun(tmp_path / "runs", tmp_path / "sock", "--slow-rank", "1", "--slow-s", "0.02")
    (job,) = (tmp_path / "runs").iterdir()
    summary = report(job)
    straggler = summary["alerts"]["straggler"]
    assert straggler["ranks"] == [1]
    assert straggler["first_step"] < 40
    (alert,) = [a for a in summary["cross_rank"] if a["rule"] == "straggler"]
    assert alert["evidence"]["rank"] == 1
    assert alert["evidence"]["cause"] == "input"
    phases = alert["evidence"]["phase_medians"]
    # The victim (rank 0) waits ~20 ms at the all-reduce inside its backward; the culprit waits for its data.
    assert phases["0"]["backward_s"] > 0.015 > phases["1"]["backward_s"]
    assert phases["1"]["data_wait_s"] > 0.015 > phases["0"]["data_wait_s"]


def losses(job: Path) -> dict[int, dict[int, float]]:
    """Each rank's loss by step, from its ledger."""
    return {
        rank: {r["step"]: r["loss"] for r in read_ledger(path) if r["kind"] == "step"}
        for rank, path in rank_ledgers(job).items()
    }


def both_ranks(socket_dir: Path) -> list[LiveRun] | None:
    runs = list_live_runs(socket_dir)
    return runs if len(runs) == 2 else None


def test_a_checkpoint_set_taken_at_one_step_resumes_the_job_exactly(tmp_path: Path, socket_dir: Path):
    torchrun(tmp_path / "straight", socket_dir)
    (straight,) = (tmp_path / "straight").iterdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPTS / "ddp_train.py")]
    # Paced so that the command for step 30 reaches both ranks before it: at 0.02 s a step a loaded CI machine found
    # the job's 64 steps over (1.3 s) before it had listed both ranks, and waited 60 s for them in vain.
    paced = subprocess.Popen(
        [*cmd, "--run-dir", str(tmp_path / "paced"), "--step-sleep", "0.1"],
        env=env_for(socket_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(paced)
    # What the viewer does on `c` for a job: the same command, with the same `at`, to every rank.
    runs = wait_until(lambda: both_ranks(socket_dir), 60, "both ranks")
    socks = [connect(run.socket) for run in runs]
    for sock in socks:
        sock.sendall(command_line("checkpoint", 1, at=30))
    for sock in socks:
        reply = next(r for r in iter_records(sock) if r.get("kind") == "action")
        sock.close()
        assert reply["ok"] is True, reply
        assert reply["steps_done"] == 30
    _, err = paced.communicate(timeout=240)
    assert paced.returncode == 0, err[-2000:]
    (job,) = (tmp_path / "paced").iterdir()
    assert sorted(p.relative_to(job).as_posix() for p in job.glob("rank*/checkpoints/*.pt")) == [
        "rank0/checkpoints/step-30.pt",
        "rank1/checkpoints/step-30.pt",
    ]

    torchrun(tmp_path / "resumed", socket_dir, "--resume-from", str(job), "--resume-step", "30")
    (resumed,) = (tmp_path / "resumed").iterdir()
    expected, got = losses(straight), losses(resumed)
    for rank in (0, 1):
        assert sorted(got[rank]) == list(range(30, 64))
        assert got[rank] == {step: loss for step, loss in expected[rank].items() if step >= 30}


def test_an_fsdp_job_says_its_ranks_norms_are_their_shards(tmp_path: Path):
    # Under fully_shard each rank's gradients are its shard: the norm a rank measures is its shard's (0.59 and
    # 0.61 where the model's is 0.85), and reading the model's would take a collective in a hook. The run record
    # says so; the viewer, which has both ranks' records, combines them.
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPTS / "fsdp_train.py")]
    done = subprocess.run(
        [*cmd, str(runs), str(out)], env=env_for(tmp_path / "sock"), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (job,) = runs.iterdir()
    for rank, path in rank_ledgers(job).items():
        ledger = list(read_ledger(path))
        assert ledger[0]["sharded"] is True
        seen = json.loads((out / f"rank{rank}.json").read_text())
        steps = [r for r in ledger if r["kind"] == "step"]
        assert [s["grad_norm"] for s in steps] == pytest.approx(seen["shard"], rel=1e-5)
        assert all(shard < whole for shard, whole in zip(seen["shard"], seen["model"], strict=True))
    # The viewer with both ranks shows the model's: the root of the sum of the shards' squares, step by step.
    ranks = RanksState([0, 1], 2)
    main: list[Record] = []
    for rank, path in sorted(rank_ledgers(job).items()):
        ranks.connected(rank)
        main += ranks.apply(rank, read_ledger(path), now=0.0)
    combined = [r["grad_norm"] for r in main if r["kind"] == "step"]
    assert combined == pytest.approx(json.loads((out / "rank0.json").read_text())["model"], rel=1e-5)


def test_a_ddp_loop_without_an_optimizer_or_marks_records_the_all_reduced_norm_on_every_rank(tmp_path: Path):
    # Its update is told where its backward ends: after DDP's own end-of-backward callback, which waits for the
    # gradients' all-reduce. Told before it, each rank recorded its local gradients' norm.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPTS / "ddp_by_hand.py")]
    done = subprocess.run(
        [*cmd, "--run-dir", str(tmp_path / "runs")],
        env=env_for(tmp_path / "sock"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = {r["rank"]: r["norms"] for r in map(json.loads, done.stdout.splitlines()) if "norms" in r}
    assert printed[0] == pytest.approx(printed[1])  # all-reduced: the same on both ranks
    (job,) = (tmp_path / "runs").iterdir()
    for rank, path in rank_ledgers(job).items():
        steps = [r for r in read_ledger(path) if r["kind"] == "step"]
        assert [s["opt_step"] for s in steps] == [1, 2, 3, 4]
        assert [s["grad_norm"] for s in steps] == pytest.approx(printed[rank], rel=1e-5)
