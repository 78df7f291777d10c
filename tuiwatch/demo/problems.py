"""The demo's problems: small models on synthetic data, fast on a laptop CPU, seeded end to end.

- ``mlp``: the seed's 2-32-2 MLP on a linearly separable 2-D problem.
- ``cnn``: a small CNN on synthetic 32×32 RGB images, where each class is a
  bright square at its own place under noise.

The pieces (:func:`separable`, :func:`seeded_problem`, :func:`loader`,
:func:`mlp`) are what each fault scenario builds its own problem from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

MODELS = ("mlp", "cnn")


@dataclass
class Problem:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    train: DataLoader[tuple[torch.Tensor, ...]]
    val: tuple[torch.Tensor, torch.Tensor]


def separable(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D points; the label says which side of a line they fall."""
    x = torch.randn(n, 2, generator=g)
    return x, (x @ torch.tensor([1.5, -1.0]) > 0).long()


def seeded_problem(seed: int, n: int = 4096) -> tuple[torch.Generator, torch.Tensor, torch.Tensor]:
    """The data's generator, torch's seed (for the model's init) and :func:`separable`, in that order."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x, y = separable(n, g)
    return g, x, y


def loader(x: torch.Tensor, y: torch.Tensor, g: torch.Generator, batch_size: int = 64, **kw: Any) -> DataLoader[Any]:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=g, **kw)


def batched(x: torch.Tensor, y: torch.Tensor, g: torch.Generator, batch_size: int = 64) -> DataLoader[Any]:
    """Shuffled batches fetched with one index each, as a loader of tensors in memory should be.

    The same batches, in the same order, as ``loader(x, y, g)``; its per-row
    fetch and collate is 40 % of the tiny MLP's step, near ``data-bound``'s
    bar, where a loaded host pushes a healthy run over it.
    """
    rows = BatchSampler(RandomSampler(range(len(x)), generator=g), batch_size, drop_last=False)
    return DataLoader(TensorDataset(x, y), sampler=rows, batch_size=None, generator=g)


def mlp(width: int = 32, inputs: int = 2, classes: int = 2, dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(width, classes))


def mlp_problem(seed: int, dropout: float = 0.0) -> Problem:
    g = torch.Generator().manual_seed(seed)
    x, y = separable(4096, g)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 2))
    train = batched(x, y, g)
    return Problem(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), train, separable(512, g))


def cnn_problem(seed: int, dropout: float = 0.0, classes: int = 4) -> Problem:
    g = torch.Generator().manual_seed(seed)

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, classes, (n,), generator=g)
        x = 0.5 * torch.randn(n, 3, 32, 32, generator=g)
        for c in range(classes):
            row, col = divmod(c, 2)
            x[y == c, :, 4 + 14 * row : 12 + 14 * row, 4 + 14 * col : 12 + 14 * col] += 1.5
        return x, y

    x, y = sample(2048)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(16 * 8 * 8, classes),
    )
    train = batched(x, y, g)
    return Problem(model, torch.optim.Adam(model.parameters(), lr=1e-3), train, sample(256))


PROBLEMS: dict[str, Callable[..., Problem]] = {"mlp": mlp_problem, "cnn": cnn_problem}
