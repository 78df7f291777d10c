"""The training loop every fault scenario shares: the three-line integration, and room for one bug.

Each scenario module builds its data, model and optimizer, plants its bug
through the keywords of :func:`train`, and says which rule should name it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Outcome:
    """How a scenario ended: its Watch (run directory, ledger), the steps it took, what it raised."""

    watch: tuiwatch.Watch
    steps: int
    error: BaseException | None = None
    kept: list[Any] = field(default_factory=list)


def separable(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The healthy demo's problem: 2-D points, the label says which side of a line they fall."""
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


def mlp(width: int = 32, inputs: int = 2, classes: int = 2, dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(width, classes))


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    *,
    name: str,
    steps: int,
    run_dir: str | Path | None,
    seed: int,
    loss_fn: LossFn = nn.functional.cross_entropy,
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
    scheduler: Any = None,
    scheduler_per_batch: bool = False,
    clip: float | None = 5.0,
    accumulate: int = 1,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
    val_every: int = 100,
    val_in_train_mode: bool = False,
    keep_losses: bool = False,
    delay_s: float = 0.0,
    expected: tuple[type[BaseException], ...] = (),
    **watch_kwargs: Any,
) -> Outcome:
    """Train for ``steps`` steps over ``batches`` (re-iterated per epoch) with a Watch attached."""
    watch = tuiwatch.Watch(model, optimizer, name=name, run_dir=run_dir, seed=seed, scheduler=scheduler,
                           **watch_kwargs)  # fmt: skip
    outcome = Outcome(watch, 0)
    reason = "finished"
    try:
        while outcome.steps < steps and not watch.should_stop:
            model.train()
            for x, y in watch.batches(batches):
                logits = forward(model, x) if forward is not None else model(x)
                loss = loss_fn(logits, y)
                watch.log(loss=loss)
                if keep_losses:
                    outcome.kept.append(loss)  # the bug: each loss keeps its whole graph alive...
                # ...and retain_graph keeps its tensors
                (loss / accumulate).backward(retain_graph=keep_losses)  # type: ignore[no-untyped-call]
                outcome.steps += 1
                if outcome.steps % accumulate == 0:
                    if clip is not None:
                        watch.clip_grad_norm_(clip)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if scheduler is not None and scheduler_per_batch:
                        scheduler.step()
                if val is not None and outcome.steps % val_every == 0:
                    validate(watch, model, val, train_mode=val_in_train_mode, loss_fn=loss_fn)
                if delay_s:
                    time.sleep(delay_s)  # keeps the demo watchable; not a synchronisation
                if outcome.steps >= steps or watch.should_stop:
                    break
            if scheduler is not None and not scheduler_per_batch:
                scheduler.step()
    except expected as exc:
        outcome.error = exc
        reason = "nonfinite" if isinstance(exc, tuiwatch.NonFiniteError) else "exception"
    except KeyboardInterrupt:
        reason = "stopped"
    finally:
        watch.close(reason)
    return outcome


def validate(
    watch: tuiwatch.Watch, model: nn.Module, val: tuple[torch.Tensor, torch.Tensor], *, train_mode: bool,
    loss_fn: LossFn,
) -> None:  # fmt: skip
    x, y = val
    with watch.validation(), torch.no_grad():
        if not train_mode:
            model.eval()
        logits = model(x)
        watch.log(val_loss=loss_fn(logits, y), val_acc=(logits.argmax(1) == y).float().mean())
    model.train()
