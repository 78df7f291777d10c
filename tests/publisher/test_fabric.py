"""A loop under Lightning Fabric with the three lines: the structure of Lightning's own example
(examples/fabric/language_model/train.py), on a small model and data made here.

``fabric.setup_dataloaders`` hands the loop a ``_FabricDataLoader``, which is no DataLoader: its batches had no
sample ids. Its ``validate()`` restores ``model.train()`` before returning the loss the loop then logs, which
raised ``eval-mode`` on every evaluation of a healthy run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, random_split

import tuiwatch

L = pytest.importorskip("lightning", reason="lightning is in the dev dependencies")


class Numbered(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i's input starts with i: a batch says which samples it holds."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.x[:, 0] = torch.arange(n)
        self.y = (self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


@torch.no_grad()
def validate(model: Any, val_dataloader: Any) -> torch.Tensor:
    """The example's, as published: eval mode for the forwards, train mode restored before returning."""
    model.eval()
    losses = torch.zeros(len(val_dataloader))
    for k, (inputs, target) in enumerate(val_dataloader):
        losses[k] = F.cross_entropy(model(inputs), target).item()
    model.train()
    return losses.mean()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_fabric_example_loop_records_its_ids_and_evaluations_without_a_false_alarm(run_root: Path, workers: int):
    L.seed_everything(42)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    dataset = Numbered(200)
    train_set, val_set = random_split(dataset, [160, 40], generator=torch.Generator().manual_seed(42))
    train_loader = DataLoader(train_set, batch_size=20, shuffle=True, num_workers=workers)
    val_loader = DataLoader(val_set, batch_size=20)
    model = nn.Sequential(nn.Linear(4, 32), nn.Dropout(0.1), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    train_loader, val_loader = fabric.setup_dataloaders(train_loader, val_loader)
    drawn: list[list[int]] = []
    with tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(2):
            for inputs, target in watch.batches(train_loader):
                drawn.append(inputs[:, 0].long().tolist())
                loss = F.cross_entropy(model(inputs), target)
                watch.log(loss=loss)
                fabric.backward(loss)
                fabric.clip_gradients(model, optimizer, clip_val=0.25)
                optimizer.step()
                optimizer.zero_grad()
            val_loss = validate(model, val_loader)
            with watch.validation():
                watch.log(val_loss=val_loss)
    assert watch.ledger_path is not None
    ledger = list(tuiwatch.read_ledger(watch.ledger_path))
    steps = [r for r in ledger if r["kind"] == "step"]
    # Each step's ids are the samples it trained on: indices into the loader's dataset (the split's Subset).
    assert [[train_set.indices[i] for i in r["batch_ids"]] for r in steps] == drawn
    assert len(drawn) == 16
    assert drawn[0] != drawn[8]  # two epochs, each its own shuffle
    assert [(r["step"], r["training"]) for r in ledger if r["kind"] == "eval"] == [(7, False), (15, False)]
    assert not [r for r in ledger if r["kind"] == "alert" and r["severity"] != "info"]
