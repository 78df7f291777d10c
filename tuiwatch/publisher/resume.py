"""Checkpoints that resume exactly: what one holds (SPEC §7), and putting a run back where it was.

A checkpoint is taken at a step boundary, where model, optimizer, scheduler,
scaler, the RNGs and the data position agree. Restoring loads them all and
arranges for the next ``watch.batches(loader)`` to replay the saved epoch's
shuffle and skip the batches already trained on (docs/checkpoints.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuiwatch.errors import TuiwatchError
from tuiwatch.publisher.checkpoints import FORMAT, Checkpoint, load_checkpoint, restore_rng, rng_states
from tuiwatch.publisher.environment import versions
from tuiwatch.publisher.loader import IndexRecorder
from tuiwatch.publisher.steps import StepTracker


@dataclass
class Trainables:
    """What a checkpoint saves besides the step counts: the objects the Watch was given."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    scaler: Any


def epoch_rng(loader: Any) -> dict[str, Any]:
    """The RNG states a loader's shuffle draws from, taken before ``iter(loader)``."""
    generator = getattr(loader, "generator", None)
    return {
        "rng": rng_states(),
        "loader_generator": generator.get_state() if isinstance(generator, torch.Generator) else None,
    }


def restore_epoch_rng(saved: dict[str, Any], loader: Any) -> None:
    restore_rng(saved["rng"])
    generator = getattr(loader, "generator", None)
    if saved.get("loader_generator") is not None and isinstance(generator, torch.Generator):
        generator.set_state(saved["loader_generator"])


def checkpoint_state(
    parts: Trainables, tracker: StepTracker, *, name: str, run_id: str, epoch_rng: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "tuiwatch_checkpoint": FORMAT,
        "name": name,
        "run_id": run_id,
        "step": tracker.step,
        "epoch": max(tracker.epoch, 0),
        "batch_index": tracker.batch_index,
        "opt_steps": tracker.opt_steps,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict() if parts.optimizer is not None else None,
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
        "rng": rng_states(),
        "epoch_rng": epoch_rng,
        "versions": versions(),
    }


def restore(path: str | Path, parts: Trainables, tracker: StepTracker) -> Checkpoint:
    """Load the checkpoint into ``parts``, the RNGs and the step counts."""
    ckpt = load_checkpoint(path)
    parts.model.load_state_dict(ckpt.model)
    pairs: list[tuple[str, Any, dict[str, Any] | None]] = [
        ("optimizer", parts.optimizer, ckpt.optimizer),
        ("scheduler", parts.scheduler, ckpt.scheduler),
        ("scaler", parts.scaler, ckpt.scaler),
    ]
    for name, target, saved in pairs:
        if saved is not None and target is None:
            raise TuiwatchError(f"the checkpoint has a {name} state: give Watch(..., {name}=...) to restore it")
        if saved is not None:
            target.load_state_dict(saved)
    tracker.step = ckpt.step
    tracker.epoch = ckpt.epoch - 1  # the next batches() call is the saved epoch
    tracker.opt_steps = ckpt.opt_steps
    restore_rng(ckpt.rng)
    return ckpt


def fast_forward(it: Iterator[Any], recorder: IndexRecorder | None, ckpt: Checkpoint, tracker: StepTracker) -> None:
    """Skip the batches of the saved epoch that were already trained on."""
    for _ in range(ckpt.batch_index):
        next(it, None)
        if recorder is not None:
            recorder.pop()
    tracker.batch_index = ckpt.batch_index
    restore_rng(ckpt.rng)  # the RNGs as they were at the checkpoint, after the epoch's shuffle
