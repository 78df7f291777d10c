"""The ``tuiwatch`` command as a user runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import env_for, finish, ledger_file, records, start_training, wait_until

pytestmark = pytest.mark.integration  # the command line in subprocesses, with real trainings

TUIWATCH = [sys.executable, "-m", "tuiwatch"]


def tw(socket_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TUIWATCH, *args], env=env_for(socket_dir), capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_ls_says_when_nothing_runs(socket_dir: Path):
    out = tw(socket_dir, "ls")
    assert out.returncode == 0
    assert out.stdout.strip() == "no live runs (start one with: tuiwatch demo)"
    assert json.loads(tw(socket_dir, "ls", "--json").stdout) == []


def test_ls_lists_a_live_run_and_removes_stale_sockets(run_root: Path, socket_dir: Path):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_dir / f"ghost.{os.getpid()}.sock"))  # bound, never listening: nothing answers
    stale.close()
    (socket_dir / "dead.999999999.sock").touch()  # a pid that cannot exist
    proc = start_training(run_root, socket_dir, "--name", "resnet", "--steps", "400", "--step-sleep", "0.005")
    ledger = wait_until(lambda: next(iter(run_root.glob("*/ledger.jsonl")), None), what="ledger")
    wait_until(lambda: any(r["kind"] == "step" for r in records(ledger)), what="a step")
    listed = json.loads(tw(socket_dir, "ls", "--json").stdout)
    assert [(r["name"], r["pid"], r["status"]) for r in listed] == [("resnet", proc.pid, "live")]
    assert listed[0]["step"] >= 0
    assert listed[0]["ledger"] == str(ledger)
    table = tw(socket_dir, "ls").stdout.splitlines()
    assert table[0].split() == ["NAME", "PID", "STEP", "STATUS", "SOCKET"]
    assert table[1].split()[:2] == ["resnet", str(proc.pid)]
    assert sorted(p.name for p in socket_dir.iterdir()) == [f"resnet.{proc.pid}.sock"]
    finish(proc)


def test_ls_refuses_an_unsafe_socket_directory_in_one_line(tmp_path: Path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    out = tw(loose, "ls")
    assert out.returncode == 1
    assert (
        out.stderr.strip() == f"tuiwatch: error: socket directory {loose} has mode 0777, other users could "
        f"reach the runs: run 'chmod 700 {loose}'"
    )


def test_demo_trains_and_writes_a_ledger(tmp_path: Path, socket_dir: Path):
    out = tw(socket_dir, "demo", "--no-viewer", "--steps", "300", "--delay", "0", "--run-dir", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr
    assert "tuiwatch demo: finished after 300 steps" in out.stdout
    ledger = records(ledger_file(tmp_path / "runs"))
    steps = [r for r in ledger if r["kind"] == "step"]
    assert len(steps) == 300
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert ledger[-1]["reason"] == "finished"
    assert [r for r in ledger if r["kind"] == "alert" and r["severity"] != "info"] == []  # a healthy run is quiet


def test_demo_cnn_trains(tmp_path: Path, socket_dir: Path):
    out = tw(socket_dir, "demo", "--model", "cnn", "--steps", "10", "--delay", "0", "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 0, out.stderr
    ledger = records(ledger_file(tmp_path / "r"))
    steps = [r for r in ledger if r["kind"] == "step"]
    assert steps[0]["batch_shape"] == [[64, 3, 32, 32], [64]]
    assert [r for r in ledger if r["kind"] == "alert" and r["severity"] != "info"] == []


def test_demo_fault_prints_the_rule_that_names_it_and_the_first_bad_module(tmp_path: Path, socket_dir: Path):
    out = tw(socket_dir, "demo", "--no-viewer", "--fault", "nan-input", "--delay", "0", "--run-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "tuiwatch demo: fault nan-input (A NaN in one input sample.); expect nonfinite"
    assert lines[1].startswith("  step ")
    assert "nonfinite — first at step" in lines[1]
    assert "boundary=batch" in lines[1]
    assert lines[2].startswith("  raised NonFiniteError: nonfinite: first at step")
    assert lines[3] == (
        "  first_nonfinite_module(model, load_dump(dump).batch): the batch itself holds NaN/inf; "
        "first non-finite output: 0 (Linear)"
    )
    assert len(list(tmp_path.glob("fault-nan-input-*/dumps/*-nonfinite/weights.pt"))) == 1
    unknown = tw(socket_dir, "demo", "--fault", "nan")
    assert unknown.returncode == 2
    assert "argument --fault: invalid choice: 'nan'" in unknown.stderr


def test_doctor_reports_each_part_with_a_fix_for_failures(tmp_path: Path, socket_dir: Path):
    out = tw(socket_dir, "doctor", "--run-dir", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    import torch  # (this test's, to know what doctor must say of it: the dev pin's CPU build, or PyPI's CUDA build)

    if torch.version.cuda is None:
        assert lines[0] == f"ok    torch {torch.__version__}: CPU build"
    elif not torch.cuda.is_available():  # Python 3.10 here gets PyPI's CUDA build, on a machine without a GPU
        assert lines[0] == f"warn  torch {torch.__version__}: CUDA {torch.version.cuda} build, but no GPU is usable"
        assert lines[1] == "      fix: check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi)"
    else:
        assert lines[0].startswith(f"ok    torch {torch.__version__}, CUDA {torch.version.cuda}, ")
    assert any(line.startswith(("ok    NVML", "warn  NVML")) for line in lines)
    assert f"ok    socket directory {socket_dir} (mode 700, yours)" in lines
    assert any(line.startswith(f"ok    run directory {tmp_path / 'runs'}: writable") for line in lines)
    socket_dir.chmod(0o777)
    try:
        broken = tw(socket_dir, "doctor", "--run-dir", str(tmp_path / "runs"))
    finally:
        socket_dir.chmod(0o700)
    assert broken.returncode == 1
    failing = broken.stdout.splitlines()
    at = next(i for i, line in enumerate(failing) if line.startswith("fail  socket directory"))
    assert failing[at + 1] == "      fix: set TUIWATCH_DIR to a directory only you can write"


def test_help_is_there_for_every_command(socket_dir: Path):
    for args in ((), ("ls",), ("demo",), ("attach",), ("replay",), ("report",), ("diff",), ("relay",), ("doctor",)):
        out = tw(socket_dir, *args, "--help")
        assert out.returncode == 0
        assert out.stdout.startswith("usage: tuiwatch")


def test_usage_errors_are_one_line(socket_dir: Path):
    out = tw(socket_dir, "demo", "--steps", "0")
    assert out.returncode == 2
    assert (
        out.stderr.strip() == "tuiwatch demo: error: argument --steps: must be at least 1, got 0 "
        "(see 'tuiwatch demo --help')"
    )


FIXTURES = Path(__file__).parents[1] / "fixtures" / "ledgers"


def test_report_summarises_a_ledger_as_text_and_json(socket_dir: Path):
    text = tw(socket_dir, "report", str(FIXTURES / "alerts.jsonl"))
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0].startswith("run        demo-mlp (")
    assert "end        nonfinite" in lines
    assert "steps      121 in" in text.stdout
    assert any(line.split()[:4] == ["loss-spike", "warning", "x1", "first"] for line in lines)
    summary = json.loads(tw(socket_dir, "report", "--json", str(FIXTURES / "healthy.jsonl")).stdout)
    steps = [json.loads(line) for line in (FIXTURES / "healthy.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert summary["steps"] == 150
    assert summary["end"] == "finished"
    assert summary["alerts"] == {}
    assert summary["final_loss"] == steps[-1]["loss"]
    # "best" is the best mean of 100 consecutive steps, not the luckiest batch.
    losses = [s["loss"] for s in steps]
    means = [(sum(losses[i - 100 : i]) / 100, steps[i - 1]["step"]) for i in range(100, len(losses) + 1)]
    assert summary["best_loss"] == pytest.approx(min(means)[0])
    assert summary["best_step"] == min(means)[1]
    assert summary["min_loss"] == min(losses)
    assert summary["eval_metrics"]["val_loss"]["best"] == 0.022409267723560333
    assert summary["eval_metrics"]["val_acc"]["lower_is_better"] is False
    assert 0 < summary["data_wait_share"] < 1


def test_viewer_commands_fail_in_one_line(socket_dir: Path, tmp_path: Path):
    cases = {
        ("replay", str(tmp_path / "nope")): f"tuiwatch: error: no ledger at {tmp_path / 'nope'}: give a ledger.jsonl "
        "file, a run directory or a directory of runs",
        ("attach",): "tuiwatch: error: no live runs on this host: start one (tuiwatch demo --no-viewer) or replay a "
        "ledger",
        ("attach", "resnet"): "tuiwatch: error: no live runs on this host: start one (tuiwatch demo --no-viewer) or "
        "replay a ledger",
        ("attach", str(tmp_path / "x.sock")): f"tuiwatch: error: no socket at {tmp_path / 'x.sock'}: is the run "
        "still going? (tuiwatch ls lists live runs)",
    }
    for args, message in cases.items():
        out = tw(socket_dir, *args)
        assert out.returncode == 1
        assert out.stderr.strip() == message


def test_attach_names_the_live_runs_when_the_name_is_wrong(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--name", "resnet", "--steps", "400", "--step-sleep", "0.005")
    wait_until(lambda: next(iter(socket_dir.glob("*.sock")), None), what="socket")
    out = tw(socket_dir, "attach", "bert")
    assert out.returncode == 1
    assert out.stderr.strip() == f"tuiwatch: error: no live run named 'bert'; live runs: resnet (pid {proc.pid})"
    finish(proc)
