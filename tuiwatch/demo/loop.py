"""The one training loop of the demo, the fault scenarios and the healthy runs: the three-line integration.

A scenario builds its data, model and optimizer, plants its bug in its own
module (a bad batch, a bad loss, a hook on the loss), and trains here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tuiwatch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Outcome:
    """How a training ended: its Watch (run directory, ledger), the steps it took, what it raised."""

    watch: tuiwatch.Watch
    steps: int
    error: BaseException | None = None
    kept: list[Any] = field(default_factory=list)  # whatever a scenario's on_loss keeps


@dataclass
class Validation:
    """Evaluate on ``data`` every ``every`` steps, or at the end of each epoch when ``every`` is None."""

    data: tuple[torch.Tensor, torch.Tensor]
    every: int | None = None
    in_train_mode: bool = False  # the eval-train-mode bug: no model.eval()


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
    val: Validation | None = None,
    on_loss: Callable[[Outcome, torch.Tensor], Any] | None = None,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
    delay_s: float = 0.0,
    expected: tuple[type[BaseException], ...] = (),
    **watch_kwargs: Any,
) -> Outcome:
    """Train for ``steps`` steps over ``batches`` (re-iterated per epoch) with a Watch attached.

    ``on_loss(outcome, loss)`` sees each loss before its backward (a scenario's
    bug can live there; returning True keeps the graph for a second
    backward); ``on_step(step, loss)`` runs after each step (status lines).
    ``expected`` exceptions end the run and are returned, not raised.
    """
    watch = tuiwatch.Watch(model, optimizer, name=name, run_dir=run_dir, seed=seed, scheduler=scheduler, **watch_kwargs)
    outcome = Outcome(watch, 0)
    reason = "finished"
    try:
        while outcome.steps < steps and not watch.should_stop:
            model.train()
            for x, y in watch.batches(batches):
                logits = forward(model, x) if forward is not None else model(x)
                loss = loss_fn(logits, y)
                watch.log(loss=loss)
                retain = bool(on_loss(outcome, loss)) if on_loss is not None else False
                (loss / accumulate).backward(retain_graph=retain)  # type: ignore[no-untyped-call]
                outcome.steps += 1
                if outcome.steps % accumulate == 0:
                    if clip is not None:
                        watch.clip_grad_norm_(clip)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if scheduler is not None and scheduler_per_batch:
                        scheduler.step()
                if on_step is not None:
                    on_step(outcome.steps, loss)
                if val is not None and val.every is not None and outcome.steps % val.every == 0:
                    validate(watch, model, val, loss_fn)
                if delay_s:
                    time.sleep(delay_s)  # keeps the demo watchable; not a synchronisation
                if outcome.steps >= steps or watch.should_stop:
                    break
            if val is not None and val.every is None:
                validate(watch, model, val, loss_fn)
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


def validate(watch: tuiwatch.Watch, model: nn.Module, val: Validation, loss_fn: LossFn) -> None:
    x, y = val.data
    with watch.validation(), torch.no_grad():
        if not val.in_train_mode:
            model.eval()
        logits = model(x)
        watch.log(val_loss=loss_fn(logits, y), val_acc=(logits.argmax(1) == y).float().mean())
    model.train()
