"""A real training script in a subprocess: the ledger says what the loop did."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.ledger.records import FINITE_BOUNDARIES, RUN_FIELDS, STEP_FIELDS, SYSTEM_FIELDS
from tuiwatch.wire.socketdir import list_sockets

from ..helpers import finish, ledger_file, load_truth, records, start_training

pytestmark = pytest.mark.integration  # a real training script in a subprocess

NULL_ON_CPU = {"mem_allocated", "mem_reserved", "mem_peak", "tokens"}
SAMPLED = {"update_norm", "param_norm"}  # every 10th optimizer step by default (the run record says so)


@pytest.fixture(scope="module")
def slow_loader_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], Path]:
    base = tmp_path_factory.mktemp("ledger")
    sock_dir = base / "s"
    sock_dir.mkdir(mode=0o700)
    truth = base / "truth.jsonl"
    proc = start_training(
        base / "runs",
        sock_dir,
        "--steps",
        "20",
        "--batch",
        "4",
        "--item-sleep",
        "0.005",
        "--clip",
        "0.5",
        truth=truth,
    )
    finish(proc)
    return ledger_file(base / "runs"), load_truth(truth), sock_dir


def test_ledger_starts_with_a_complete_run_record(slow_loader_run):
    path, _, _ = slow_loader_run
    first = records(path)[0]
    assert first["kind"] == "run"
    assert set(RUN_FIELDS) <= set(first)
    assert first["name"] == "train"
    assert first["device"] == "cpu"
    assert first["torch"].startswith("2.13")
    assert first["update_norm_every"] == 10
    assert first["param_norm_every"] == 10


def test_every_step_record_has_every_field(slow_loader_run):
    path, _, _ = slow_loader_run
    steps = records(path, "step")
    assert [s["step"] for s in steps] == list(range(20))
    for s in steps:
        assert set(STEP_FIELDS) <= set(s)
        for field in set(STEP_FIELDS) - NULL_ON_CPU - SAMPLED:
            assert s[field] is not None, f"step {s['step']} has {field}=null"
        sampled = (s["opt_step"] - 1) % 10 == 0
        assert (s["update_norm"] is not None) == sampled
        assert (s["param_norm"] is not None) == sampled
        assert set(s["finite"]) == set(FINITE_BOUNDARIES)
        assert s["finite"] == {b: True if b != "param" or sampled else None for b in FINITE_BOUNDARIES}
        assert s["training"] is True
        assert s["batch_shape"] == [[4, 2], [4], [4]]


def test_values_equal_what_the_loop_computed(slow_loader_run):
    path, truth, _ = slow_loader_run
    steps = records(path, "step")
    for s, t in zip(steps, truth, strict=True):
        assert s["loss"] == t["loss"]
        assert s["lr"] == t["lr"]
        assert math.isclose(s["grad_norm"], t["grad_norm"], rel_tol=1e-6)
        assert s["grad_norm_clipped"] == (t["grad_norm"] > 0.5)
        assert s["batch_ids"] == t["ids"]
        assert s["opt_step"] == s["step"] + 1


def test_data_wait_reflects_a_slow_loader(slow_loader_run):
    path, _, _ = slow_loader_run
    for s in records(path, "step"):
        assert s["data_wait_s"] >= 4 * 0.005  # four items of 5 ms each
        assert s["compute_s"] > 0
        assert math.isclose(s["examples_per_s"], 4 / (s["data_wait_s"] + s["compute_s"]), rel_tol=1e-9)


def test_validation_writes_eval_records_and_the_run_ends(slow_loader_run):
    path, _, sock_dir = slow_loader_run
    evals = records(path, "eval")
    assert [e["step"] for e in evals] == [15, 19]  # 16 batches per epoch, the second epoch cut at 20
    assert all(e["training"] is False and e["val_loss"] > 0 for e in evals)
    last = records(path)[-1]
    assert last["kind"] == "end"
    assert last["reason"] == "finished"
    assert last["dropped_records"] == 0
    assert list_sockets(sock_dir) == []  # the socket went with the run


def test_a_three_step_run_has_three_steps_and_an_end(run_root: Path, socket_dir: Path):
    finish(start_training(run_root, socket_dir, "--steps", "3"))
    kinds = [r["kind"] for r in records(ledger_file(run_root)) if r["kind"] in ("run", "step", "end")]
    assert kinds == ["run", "step", "step", "step", "end"]


def test_interpreter_exit_closes_the_ledger_without_close(run_root: Path, socket_dir: Path):
    finish(start_training(run_root, socket_dir, "--steps", "5", "--no-close"))
    all_records = records(ledger_file(run_root))
    assert len([r for r in all_records if r["kind"] == "step"]) == 5
    assert all_records[-1]["kind"] == "end"
    assert all_records[-1]["reason"] == "finished"


def test_system_records_say_there_is_no_gpu_here(slow_loader_run):
    path, _, _ = slow_loader_run
    systems = records(path, "system")
    assert systems, "the sampler writes one on its first cycle"
    for r in systems:
        assert set(SYSTEM_FIELDS) <= set(r)
        assert r["rss"] > 0
        assert r["workers"] == 0
        assert r["gpus"] is None
        assert r["gpu_error"].startswith("NVML unavailable")
