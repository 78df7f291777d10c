"""Checkpoints that resume exactly: what one holds (SPEC §7), and putting a run back where it was.

A checkpoint is taken at a step boundary, where model, optimizer, scheduler,
scaler, the RNGs and the data position agree. Restoring loads them all and
arranges for the next ``watch.batches(loader)`` to replay the saved epoch's
shuffle and skip the batches already trained on (docs/checkpoints.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuiwatch.errors import TuiwatchError
from tuiwatch.publisher.checkpoints import FORMAT, Checkpoint, CheckpointError, restore_rng, rng_states
from tuiwatch.publisher.environment import versions
from tuiwatch.publisher.loader import IndexRecorder, adapted
from tuiwatch.publisher.steps import StepTracker


@dataclass
class Trainables:
    """What a checkpoint saves besides the step counts: the objects the Watch was given."""

    model: torch.nn.Module
    optimizer: Any  # an optimizer, or a list of those that step the model (then its state is a list too)
    scheduler: Any  # as the optimizer
    scaler: Any


def _generator(loader: Any) -> Any:
    """The loader's own shuffle generator, if any (that of the DataLoader an adapter or a progress bar holds)."""
    generator = getattr(loader, "generator", None)
    base = adapted(loader) if generator is None else None
    return generator if base is None else getattr(base, "generator", None)


def epoch_rng(loader: Any) -> dict[str, Any]:
    """The RNG states a loader's shuffle draws from, taken before ``iter(loader)``."""
    generator = _generator(loader)
    return {
        "rng": rng_states(),
        "loader_generator": generator.get_state() if isinstance(generator, torch.Generator) else None,
    }


def restore_epoch_rng(saved: dict[str, Any], loader: Any) -> None:
    restore_rng(saved["rng"])
    generator = _generator(loader)
    if saved.get("loader_generator") is not None and isinstance(generator, torch.Generator):
        generator.set_state(saved["loader_generator"])


# What torch.load(weights_only=True) reads back: a checkpoint holding anything else could not be resumed from.
_PLAIN = (type(None), bool, int, float, str, bytes, torch.Tensor)


def extra_state(value: Any) -> Any:
    """``watch.extra_state`` (plain data, or a callable returning it) as it goes into a checkpoint."""
    state = value() if callable(value) else value
    bad = _not_plain(state)
    if bad is not None:
        raise CheckpointError(
            f"watch.extra_state holds a {bad}: a checkpoint keeps numbers, strings, lists, dicts and tensors"
        )
    return state


def _not_plain(value: Any) -> str | None:
    if isinstance(value, _PLAIN):
        return None
    if isinstance(value, list | tuple):
        return next((bad for v in value if (bad := _not_plain(v)) is not None), None)
    if isinstance(value, dict):
        return next((bad for kv in value.items() for v in kv if (bad := _not_plain(v)) is not None), None)
    return type(value).__name__


def link(ckpt: Checkpoint) -> dict[str, Any]:
    """The run record's ``resumed_from``: the checkpoint, its step, and the run (and ledger) that wrote it."""
    return {
        "checkpoint": str(ckpt.path.resolve()),
        "step": ckpt.step,
        "opt_steps": ckpt.opt_steps,
        "name": ckpt.name,
        "run_id": ckpt.run_id,
        "ledger": ckpt.ledger,
    }


def checkpoint_state(
    parts: Trainables,
    tracker: StepTracker,
    *,
    name: str,
    run_id: str,
    ledger: Path | None,
    epoch_rng: dict[str, Any] | None,
    extra: Any,
    replica_of: str | None = None,
) -> dict[str, Any]:
    """What a checkpoint holds; with ``replica_of`` (another rank's file of the same step, relative to this
    one's directory), no model or optimizer state: that file has the same."""
    return {
        "tuiwatch_checkpoint": FORMAT,
        "name": name,
        "run_id": run_id,
        "ledger": None if ledger is None else str(ledger),
        "extra": extra_state(extra),
        "step": tracker.step,
        "epoch": max(tracker.epoch, 0),
        "batch_index": tracker.batch_index,
        "opt_steps": tracker.opt_steps,
        "model": {} if replica_of else parts.model.state_dict(),
        "optimizer": None if replica_of else _state(parts.optimizer),
        "replica_of": replica_of,
        "scheduler": _state(parts.scheduler),
        "scaler": _state(parts.scaler),
        "rng": rng_states(),
        "epoch_rng": epoch_rng,
        "versions": versions(),
    }


def _state(part: Any) -> Any:
    """A part's state dict; a list of them for a list of parts (several optimizers, their schedulers)."""
    if part is None:
        return None
    return [p.state_dict() for p in part] if isinstance(part, list | tuple) else part.state_dict()


def _listed(part: Any) -> list[Any]:
    """A part, or its saved state, as a list: a list of one and the one alone are the same (a Watch given
    ``[adamw]`` resumes from a checkpoint of ``adamw``)."""
    if part is None:
        return []
    return list(part) if isinstance(part, list | tuple) else [part]


def _pairs(ckpt: Checkpoint, parts: Trainables) -> list[tuple[str, Any, Any]]:
    return [
        ("optimizer", parts.optimizer, ckpt.optimizer),
        ("scheduler", parts.scheduler, ckpt.scheduler),
        ("scaler", parts.scaler, ckpt.scaler),
    ]


def check_parts(ckpt: Checkpoint, parts: Trainables) -> None:
    """Refuse, before anything is loaded, a checkpoint with a state the Watch has nothing to load into."""
    for name, target, saved in _pairs(ckpt, parts):
        if saved is not None and target is None:
            raise TuiwatchError(f"the checkpoint has a {name} state: give Watch(..., {name}=...) to restore it")
        held, given = len(_listed(saved)), len(_listed(target))
        if saved is not None and held != given:
            raise TuiwatchError(
                f"the checkpoint has {held} {name} state(s) and the Watch was given {given}: "
                f"give Watch(..., {name}=...) the same {name}s, in the same order, as the run that wrote it"
            )
    for optimizer, state in zip(_listed(parts.optimizer), _listed(ckpt.optimizer), strict=False):
        saved_groups, given_groups = _group_sizes(state), _group_sizes(optimizer.state_dict())
        if saved_groups is not None and given_groups is not None and saved_groups != given_groups:
            raise TuiwatchError(
                f"the checkpoint's optimizer has param groups of {saved_groups} parameters and the Watch's of "
                f"{given_groups}: build the optimizer the run had when it wrote the checkpoint (a loop that replaced "
                "its optimizer, at a stage of unfreezing, had another) and give it to Watch(..., resume_from=...)"
            )


def _group_sizes(state: Any) -> list[int] | None:
    """How many parameters each param group of an optimizer's state dict holds (None where it is not torch's)."""
    try:
        return [len(group["params"]) for group in state["param_groups"]]
    except (KeyError, TypeError):
        return None


def restore(ckpt: Checkpoint, parts: Trainables, tracker: StepTracker) -> Checkpoint:
    """Load the checkpoint into ``parts``, the RNGs and the step counts (``check_parts`` first)."""
    parts.model.load_state_dict(ckpt.model)
    for _, target, saved in _pairs(ckpt, parts):
        for one, state in zip(_listed(target), _listed(saved), strict=False):  # (check_parts matched the counts)
            one.load_state_dict(state)
    tracker.step = ckpt.step
    tracker.epoch = ckpt.epoch - 1  # the next batches() call is the saved epoch
    tracker.opt_steps = ckpt.opt_steps
    restore_rng(ckpt.rng)
    return ckpt


def without_weights(ckpt: Checkpoint) -> Checkpoint:
    """What the Watch keeps until the loop's first ``batches()`` replays the data position: no state dicts."""
    return dataclasses.replace(ckpt, model={}, optimizer=None, scheduler=None, scaler=None)


def fast_forward(it: Iterator[Any], recorder: IndexRecorder | None, ckpt: Checkpoint, tracker: StepTracker) -> None:
    """Skip the batches of the saved epoch that were already trained on."""
    for _ in range(ckpt.batch_index):
        next(it, None)
        if recorder is not None:
            recorder.pop()
    tracker.batch_index = ckpt.batch_index
    restore_rng(ckpt.rng)  # the RNGs as they were at the checkpoint, after the epoch's shuffle
