"""A step of the three-line integration, for tests that need a few steps of a small model and look elsewhere."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from tuiwatch.publisher.watch import Watch


def train_step(
    watch: Watch,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """One step of a 4-input, 2-class model on a random batch of 8, or of any classifier on ``batch``."""
    x, y = batch if batch is not None else (torch.randn(8, 4), torch.randint(0, 2, (8,)))
    watch.step(x)
    loss = nn.functional.cross_entropy(model(x), y)
    watch.log(loss=loss)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_batches(
    watch: Watch, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, *, clip: float | None = None
) -> None:
    """``steps`` steps of a 2-input, 2-class model through ``watch.batches()``, on seeded batches of 4."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 2, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(steps)]
    train_on(watch, model, optimizer, batches, clip=clip)


def train_on(
    watch: Watch,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    *,
    clip: float | None = None,
) -> None:
    """A step of a classifier on each of ``batches`` (a list, a loader), through ``watch.batches()``, its loss
    logged."""
    for x, y in watch.batches(batches):
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
