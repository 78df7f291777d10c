"""A loop under Hugging Face Accelerate: the same three lines (issue 20, the Accelerate part).

Accelerate's ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer``
without its hook tables: a Watch given it failed at construction
(``AttributeError: ... '_optimizer_step_pre_hooks'``). The hooks now go on the
optimizer it wraps. Real Accelerate, on the CPU, one process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch
from tuiwatch.ledger.ranks import rank_ledgers

from ..helpers import SCRIPTS, env_for

accelerate = pytest.importorskip("accelerate", reason="accelerate is in the dev dependencies")


def prepared(accelerator: object, shuffle: bool) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    x = torch.randn(256, 2)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator.prepare(model, opt, loader)  # type: ignore[attr-defined,no-any-return]


def test_two_prepared_optimizers_of_one_model_are_watched_together(run_root: Path, socket_dir: Path):
    acc = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    matrices = torch.optim.Muon([p for p in model.parameters() if p.ndim == 2], lr=0.02)
    rest = torch.optim.AdamW([p for p in model.parameters() if p.ndim != 2], lr=1e-3)
    model, matrices, rest = acc.prepare(model, matrices, rest)
    x = torch.randn(64, 2)
    with tuiwatch.Watch(model, [matrices, rest], run_dir=run_root, quiet=True, update_norm_every=1) as watch:
        for _ in range(4):
            watch.step()
            before = [p.detach().clone() for p in model.parameters()]
            acc.backward(nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()))
            matrices.step()
            rest.step()
            matrices.zero_grad()
            rest.zero_grad()
            moved = sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(model.parameters(), before, strict=True))
            watch.log(moved=moved**0.5)
    assert watch.ledger_path is not None
    ledger = list(tuiwatch.read_ledger(watch.ledger_path))
    assert ledger[0]["optimizer"] == "Muon in AcceleratedOptimizer + AdamW in AcceleratedOptimizer"
    steps = [r for r in ledger if r["kind"] == "step"]
    assert [(r["opt_step"], r["lr"]) for r in steps] == [(n, [0.02, 1e-3]) for n in range(1, 5)]
    assert [r["update_norm"] for r in steps] == pytest.approx([r["moved"] for r in steps], rel=1e-5)


def test_a_prepared_loop_records_every_step_with_its_pre_clip_norm_and_lr(run_root: Path, socket_dir: Path):
    acc = accelerate.Accelerator(cpu=True)
    model, opt, loader = prepared(acc, shuffle=True)
    assert type(opt).__name__ == "AcceleratedOptimizer"
    norms: list[float] = []  # what accelerator.clip_grad_norm_ returned: the norm before it clipped
    with tuiwatch.Watch(model, opt, run_dir=run_root, quiet=True) as watch:
        for _ in range(2):
            for xb, yb in watch.batches(loader):
                loss = nn.functional.cross_entropy(model(xb), yb)
                watch.log(loss=loss)
                acc.backward(loss)
                norms.append(float(acc.clip_grad_norm_(model.parameters(), 0.5)))
                opt.step()
                opt.zero_grad()
    assert watch.ledger_path is not None
    ledger = list(tuiwatch.read_ledger(watch.ledger_path))
    steps = [r for r in ledger if r["kind"] == "step"]
    assert ledger[0]["optimizer"] == "SGD in AcceleratedOptimizer"
    assert [r["opt_step"] for r in steps] == list(range(1, 17))
    assert [r["epoch"] for r in steps] == [0] * 8 + [1] * 8
    assert all(r["lr"] == [0.1] for r in steps)
    assert [r["grad_norm"] for r in steps] == norms  # reused from Accelerate's clip, not measured after it
    assert [r["grad_norm_clipped"] for r in steps] == [n > 0.5 for n in norms]
    assert [r["opt_step"] for r in steps if r["update_norm"] is not None] == [1, 11]
    assert steps[-1]["loss"] < steps[0]["loss"]  # it trained
    assert not [r for r in ledger if r["kind"] == "alert" and r["severity"] != "info"]


def test_gradient_accumulation_gives_a_step_per_update(run_root: Path, socket_dir: Path):
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, opt, loader = prepared(acc, shuffle=False)
    with tuiwatch.Watch(model, opt, run_dir=run_root, quiet=True, step_per="optimizer") as watch:
        for xb, yb in watch.batches(loader):
            with acc.accumulate(model):
                loss = nn.functional.cross_entropy(model(xb), yb)
                watch.log(loss=loss)
                acc.backward(loss)
                opt.step()  # Accelerate skips the inner step on the first micro-batch of each pair
                opt.zero_grad()
    assert watch.ledger_path is not None
    steps = [r for r in tuiwatch.read_ledger(watch.ledger_path) if r["kind"] == "step"]
    assert [(r["step"], r["opt_step"], r.get("micro_batches")) for r in steps] == [(i, i + 1, 2) for i in range(4)]


def batches_seen(acc: Any, watched: bool, run_root: Path) -> tuple[list[torch.Tensor], list[Any]]:
    """Two epochs of a prepared, shuffled loader: the inputs drawn, and the steps the Watch wrote (if any)."""
    model, opt, loader = prepared(acc, shuffle=True)
    seen: list[torch.Tensor] = []
    if not watched:
        for _ in range(2):
            seen += [xb.clone() for xb, _ in loader]
        return seen, []
    with tuiwatch.Watch(model, opt, run_dir=run_root, quiet=True) as watch:
        for _ in range(2):
            for xb, yb in watch.batches(loader):
                seen.append(xb.clone())
                # What Accelerate asks of the sampler the recorder stands in for still answers.
                assert (loader.total_batch_size, len(loader)) == (32, 8)  # type: ignore[attr-defined]
                loss = nn.functional.cross_entropy(model(xb), yb)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
    assert watch.ledger_path is not None
    return seen, [r for r in tuiwatch.read_ledger(watch.ledger_path) if r["kind"] == "step"]


@pytest.mark.parametrize("seedable", [False, True], ids=["loader-generator", "seedable-sampler"])
def test_a_prepared_loaders_batches_have_their_sample_ids_and_the_same_order_as_without_a_watch(
    run_root: Path, socket_dir: Path, seedable: bool
):
    def accelerator() -> Any:
        config = accelerate.utils.DataLoaderConfiguration(use_seedable_sampler=seedable)
        return accelerate.Accelerator(cpu=True, dataloader_config=config)

    bare, _ = batches_seen(accelerator(), False, run_root)
    seen, steps = batches_seen(accelerator(), True, run_root)
    assert len(seen) == len(bare) == 16
    assert all(torch.equal(a, b) for a, b in zip(seen, bare, strict=True))  # each epoch's shuffle untouched
    torch.manual_seed(0)
    x = torch.randn(256, 2)  # the dataset prepared() builds: the ids index it
    for step, xb in zip(steps, seen, strict=True):
        assert torch.equal(x[step["batch_ids"]], xb), step["step"]
    epochs = [sorted(i for s in steps[k : k + 8] for i in s["batch_ids"]) for k in (0, 8)]
    assert epochs == [list(range(256))] * 2
    assert [s["batch_ids"] for s in steps[:8]] != [s["batch_ids"] for s in steps[8:]]  # reshuffled


@pytest.mark.integration
def test_accelerate_on_two_processes_is_one_job_of_two_ranks(tmp_path: Path, socket_dir: Path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(SCRIPTS / "accelerate_ddp.py")]
    norms_file = tmp_path / "norms"
    done = subprocess.run(
        [*cmd, "--run-dir", str(tmp_path / "runs"), "--norms", str(norms_file)],
        env=env_for(socket_dir),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (job,) = (tmp_path / "runs").iterdir()
    ledgers = rank_ledgers(job)
    assert sorted(ledgers) == [0, 1]
    epochs: list[list[int]] = [[], []]
    for rank, path in ledgers.items():
        ledger = list(tuiwatch.read_ledger(path))
        assert (ledger[0]["rank"], ledger[0]["world_size"]) == (rank, 2)
        assert ledger[0]["model"] == "DistributedDataParallel"
        steps = [r for r in ledger if r["kind"] == "step"]
        returned = json.loads(Path(f"{norms_file}.{rank}").read_text())
        assert returned["distributed_type"] == "DistributedType.MULTI_CPU"
        assert [r["grad_norm"] for r in steps] == returned["norms"]  # Accelerate's pre-clip norm, reused
        assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in steps)
        for r in steps:
            assert len(r["batch_ids"]) == len(set(r["batch_ids"])) == 32
            epochs[r["epoch"]] += r["batch_ids"]
    # Each epoch, the two ranks' shards together are the whole dataset once.
    assert [sorted(ids) for ids in epochs] == [list(range(512))] * 2
