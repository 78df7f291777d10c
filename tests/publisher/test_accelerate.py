"""A loop under Hugging Face Accelerate: the same three lines (issue 20, the Accelerate part).

Accelerate's ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer``
without its hook tables: a Watch given it failed at construction
(``AttributeError: ... '_optimizer_step_pre_hooks'``). The hooks now go on the
optimizer it wraps. Real Accelerate, on the CPU, one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch

accelerate = pytest.importorskip("accelerate", reason="accelerate is in the dev dependencies")


def prepared(accelerator: object, shuffle: bool) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    x = torch.randn(256, 2)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator.prepare(model, opt, loader)  # type: ignore[attr-defined,no-any-return]


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
