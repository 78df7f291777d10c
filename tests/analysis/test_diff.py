"""``tuiwatch diff`` on real CPU runs that part in known ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch
from tuiwatch.analysis.diff import FIELDS, as_text, compare
from tuiwatch.demo.problems import mlp, separable

from ..helpers import env_for

pytestmark = pytest.mark.integration  # real trainings compared by the diff command


def train(run_root: Path, *, data_seed: int = 1, init_seed: int = 0, perturb_step: int | None = None) -> Path:
    """60 steps of the demo MLP; ``perturb_step``: an update that goes slightly wrong at that step."""
    torch.manual_seed(init_seed)
    model = mlp()
    x, y = separable(4096, torch.Generator().manual_seed(7))
    loader = DataLoader(
        TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(data_seed)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = [0]

    def nondeterministic_update(*_: object) -> None:
        # Registered before the Watch's hooks: part of the update the Watch measures.
        if steps[0] == perturb_step:
            with torch.no_grad():
                next(model.parameters()).mul_(1 + 1e-6)

    optimizer.register_step_post_hook(nondeterministic_update)
    with tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False) as watch:
        for step, (xb, yb) in enumerate(watch.batches(loader)):
            steps[0] = step
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 59:
                break
    assert watch.run_dir is not None
    return watch.run_dir


def diff(socket_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuiwatch", "diff", *args],
        env=env_for(socket_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_two_runs_with_the_same_seeds_are_identical(tmp_path: Path, socket_dir: Path):
    a, b = train(tmp_path / "a"), train(tmp_path / "b")
    out = diff(socket_dir, str(a), str(b))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "steps      A has 60, B has 60; 60 in common (0-59) are compared",
        "setup      same command line, seed, versions, device and model",
        "identical: the 60 common steps agree on batch_ids, loss, grad_norm, lr, param_norm",
    ]


def test_another_sampler_seed_parts_at_the_batch_ids_of_step_0(tmp_path: Path, socket_dir: Path):
    out = diff(socket_dir, str(train(tmp_path / "a")), str(train(tmp_path / "b", data_seed=2)), "--json")
    assert out.returncode == 1
    found = json.loads(out.stdout)["difference"]
    assert (found["step"], found["field"]) == (0, "batch_ids")
    assert "data order" in found["meaning"]


def test_another_init_parts_at_the_loss_of_step_0(tmp_path: Path, socket_dir: Path):
    out = diff(socket_dir, str(train(tmp_path / "a")), str(train(tmp_path / "b", init_seed=1)))
    assert out.returncode == 1
    assert out.stdout.splitlines()[2].startswith("first difference at step 0, field loss: A=")
    assert "same batches, different loss: model init or the seed" in out.stdout


def test_a_nondeterministic_update_parts_at_the_param_norm_of_that_step(tmp_path: Path, socket_dir: Path):
    out = diff(socket_dir, str(train(tmp_path / "a")), str(train(tmp_path / "b", perturb_step=50)), "--json")
    assert out.returncode == 1
    found = json.loads(out.stdout)["difference"]
    assert (found["step"], found["field"]) == (50, "param_norm")
    # Comparing losses only, the parting shows one step later, where the changed weights first compute.
    a, b = (str(next((tmp_path / r).iterdir())) for r in ("a", "b"))
    losses = json.loads(diff(socket_dir, a, b, "--fields", "loss", "--json").stdout)["difference"]
    assert (losses["step"], losses["field"]) == (51, "loss")


def test_bad_input_is_exit_2_with_one_line(tmp_path: Path, socket_dir: Path):
    out = diff(socket_dir, str(tmp_path / "missing"), str(tmp_path / "missing"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith("tuiwatch: error: no ledger at")


def test_batches_past_the_id_cap_are_compared_by_their_digest():
    ids = list(range(4096))
    step: dict[str, Any] = {"kind": "step", "step": 0, "loss": 1.0, "batch_ids": ids, "batch_ids_count": 20_000}
    a: list[dict[str, Any]] = [{"kind": "run"}, {**step, "batch_ids_digest": "aaaa"}]
    # The same first 4,096 ids, another batch:
    b: list[dict[str, Any]] = [{"kind": "run"}, {**step, "batch_ids_digest": "bbbb"}]
    found = compare(a, b).difference
    assert found is not None
    assert (found.step, found.field) == (0, "batch_ids")
    line = next(x for x in as_text(compare(a, b), FIELDS).splitlines() if x.startswith("first difference"))
    assert line == (
        "first difference at step 0, field batch_ids: A=[0, 1, 2, 3, ..., 4094, 4095] of 20000 ids (digest aaaa) "
        "B=[0, 1, 2, 3, ..., 4094, 4095] of 20000 ids (digest bbbb)"
    )
    assert compare(a, a).difference is None


def test_two_job_directories_are_compared_rank_by_rank_and_the_first_to_part_is_named(tmp_path: Path, socket_dir: Path):
    def job(path: Path, rank1_loss_at_7: float) -> Path:
        for rank in (0, 1):
            records: list[dict[str, object]] = [
                {"kind": "run", "t": 0.0, "name": "ddp", "run_id": "j", "rank": rank, "world_size": 2, "argv": []}
            ]
            for n in range(10):
                loss = rank1_loss_at_7 if (rank, n) == (1, 7) else 1.0 / (n + 1)
                records.append({"kind": "step", "t": float(n), "step": n, "loss": loss})
            (path / f"rank{rank}").mkdir(parents=True)
            (path / f"rank{rank}" / "ledger.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        return path

    a, b = job(tmp_path / "a", 1 / 8), job(tmp_path / "b", 0.5)
    same = diff(socket_dir, str(a), str(a))
    assert (same.returncode, same.stdout) == (0, "the 2 ranks agree on every common step\n")
    parted = diff(socket_dir, str(a), str(b))
    assert parted.returncode == 1
    assert parted.stdout.startswith("rank 1 parts first:\n")
    assert "step 7" in parted.stdout
    as_json = json.loads(diff(socket_dir, str(a), str(b), "--json").stdout)
    assert as_json["first_rank"] == 1
    assert as_json["ranks"]["0"]["difference"] is None
    assert as_json["ranks"]["1"]["difference"]["step"] == 7
