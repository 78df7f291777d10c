"""Two small trainings on synthetic data, fast on a laptop CPU.

- ``mlp``: the seed's 2-32-2 MLP on a linearly separable 2-D problem.
- ``cnn``: a small CNN on synthetic 32×32 RGB images, where each class is a
  bright square at its own place under noise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch

MODELS = ("mlp", "cnn")


@dataclass
class Problem:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    train: DataLoader[tuple[torch.Tensor, ...]]
    val: tuple[torch.Tensor, torch.Tensor]


def mlp_problem(seed: int, dropout: float = 0.0) -> Problem:
    g = torch.Generator().manual_seed(seed)
    w = torch.tensor([1.5, -1.0])

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 2, generator=g)
        return x, (x @ w > 0).long()

    x, y = sample(4096)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 2))
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=g)
    return Problem(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), loader, sample(512))


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
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=g)
    return Problem(model, torch.optim.Adam(model.parameters(), lr=1e-3), loader, sample(256))


PROBLEMS: dict[str, Callable[..., Problem]] = {"mlp": mlp_problem, "cnn": cnn_problem}


def run_demo(
    model_name: str = "mlp",
    *,
    steps: int = 3000,
    delay_s: float = 0.01,
    seed: int = 0,
    run_dir: str | Path | None = "runs",
    status_every_s: float = 2.0,
    out: TextIO = sys.stdout,
) -> tuiwatch.Watch:
    """Train ``model_name`` for ``steps`` steps with a Watch attached, printing a status line now and then."""
    torch.manual_seed(seed)
    problem = PROBLEMS[model_name](seed)
    model, optimizer = problem.model, problem.optimizer
    loss_fn = nn.CrossEntropyLoss()
    watch = tuiwatch.Watch(model, optimizer, name=f"demo-{model_name}", run_dir=run_dir, seed=seed)
    print(
        f"tuiwatch demo: training the {model_name} for {steps} steps; "
        f"ledger {watch.ledger_path or '(memory only)'}; socket {watch.socket_path or '(none)'}",
        file=out,
        flush=True,
    )
    started = last_status = time.monotonic()
    step = 0
    reason = "finished"
    try:
        while step < steps and not watch.should_stop:
            model.train()
            for x, y in watch.batches(problem.train):
                loss = loss_fn(model(x), y)
                watch.log(loss=loss)
                loss.backward()
                watch.clip_grad_norm_(5.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                now = time.monotonic()
                if now - last_status >= status_every_s:
                    last_status = now
                    rate = step / (now - started)
                    print(
                        f"step {step:>6}  loss {loss.item():.4f}  {rate:,.0f} steps/s  {watch.socket_path or ''}",
                        file=out,
                        flush=True,
                    )
                if delay_s:
                    time.sleep(delay_s)  # keeps the demo watchable; not a synchronisation
                if step >= steps or watch.should_stop:
                    break
            _validate(watch, model, loss_fn, problem.val)
    except KeyboardInterrupt:
        reason = "stopped"
    finally:
        watch.close(reason)
    print(f"tuiwatch demo: {reason} after {step} steps; ledger {watch.ledger_path or '(memory only)'}", file=out)
    return watch


def _validate(
    watch: tuiwatch.Watch, model: nn.Module, loss_fn: nn.Module, val: tuple[torch.Tensor, torch.Tensor]
) -> None:
    x, y = val
    with watch.validation(), torch.no_grad():
        model.eval()
        logits = model(x)
        accuracy = (logits.argmax(1) == y).float().mean()
        watch.log(val_loss=loss_fn(logits, y), val_acc=accuracy)
    model.train()
