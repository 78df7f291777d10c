"""Checkpoints (SPEC §7): everything needed to resume a run exactly, written atomically.

``checkpoints/step-<N>.pt`` (N = steps completed) holds the model, optimizer,
scheduler and scaler state dicts, the step, epoch and batch index within the
epoch, the optimizer step count, the RNG states (python ``random``, numpy,
torch CPU, every CUDA device) now and at the start of the epoch (to replay the
epoch's shuffle up to the same batch), and the versions. Plain containers
only, so it loads with ``torch.load(weights_only=True)``.

Atomic: a temporary file in the same directory, fsync, rename, fsync of the
directory. A crash at any moment leaves the previous checkpoints and at most a
``.tmp-*`` file, never a truncated file under a final name.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuiwatch.analysis.format import size
from tuiwatch.errors import TuiwatchError
from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.nested import tensors

FORMAT = 1
# Room kept free beyond the checkpoint's own size, so that a checkpoint never fills the disk to the last byte.
SPARE_BYTES = 64 << 20


class CheckpointError(TuiwatchError):
    """A checkpoint that was refused or failed; the message says why and what to do."""


@dataclass
class Checkpoint:
    """A checkpoint read back: plain objects, tensors on the CPU."""

    path: Path
    step: int
    epoch: int
    batch_index: int
    opt_steps: int
    model: dict[str, Any]
    optimizer: dict[str, Any] | list[dict[str, Any]] | None  # a list for several optimizers, in their order
    scheduler: dict[str, Any] | list[dict[str, Any]] | None
    scaler: dict[str, Any] | None
    rng: dict[str, Any]
    epoch_rng: dict[str, Any] | None
    versions: dict[str, Any]
    name: str | None = None
    run_id: str | None = None
    ledger: str | None = None  # the ledger of the run that wrote it: a resumed run links to it
    extra: Any = None  # what the loop put in ``watch.extra_state``
    replica_of: Path | None = None  # the file of the same step whose model and optimizer states these are


def rng_states() -> dict[str, Any]:
    """Every RNG a training loop draws from, as plain containers."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = [name, keys.tolist(), pos, has_gauss, cached]
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    python = states.get("python")
    if python is not None:
        version, internal, gauss = python
        random.setstate((version, tuple(internal), gauss))
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy

        name, keys, pos, has_gauss, cached = states["numpy"]
        numpy.random.set_state((name, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def write_checkpoint(run_dir: Directory, step: int, state: dict[str, Any]) -> tuple[Path, int]:
    """Write ``state`` as ``checkpoints/step-<step>.pt`` in ``run_dir`` atomically; (path, bytes) or
    :class:`CheckpointError`."""
    try:
        # Never a symlink someone planted, and always the run's own directory, even if renamed meanwhile.
        directory = run_dir.sub("checkpoints")
    except OSError as exc:
        raise CheckpointError(f"cannot write a checkpoint: {exc}") from None
    with directory:
        for stale in directory.names():
            if stale.startswith(".tmp-"):
                directory.remove(stale)  # left by a write that a crash interrupted
        need = sum(t.nbytes for t in tensors(state)) + (1 << 20)
        free = directory.free_bytes()
        if free < need + SPARE_BYTES:
            raise CheckpointError(
                f"not enough space in {directory.path}: the checkpoint needs about {size(need)} and "
                f"{size(free)} is free (tuiwatch keeps {size(SPARE_BYTES)} spare); free space or move run_dir"
            )
        final = f"step-{step}.pt"
        tmp = f".tmp-{final}-{os.getpid()}"
        try:
            with directory.create(tmp) as f:  # O_EXCL | O_NOFOLLOW: a symlink raced onto tmp is refused
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            directory.move_into_place(tmp, final)
            return directory.where() / final, directory.size(final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                directory.remove(tmp)
            raise CheckpointError(
                f"cannot write {directory.path / final}: {exc.strerror or exc}; the previous checkpoints are intact"
            ) from None


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint file written by tuiwatch."""
    p = Path(path)
    try:
        # weights_only: a checkpoint may come from someone else's run; nothing in it runs code on load.
        data = torch.load(p, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise TuiwatchError(f"cannot read the checkpoint {p}: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict) or data.get("tuiwatch_checkpoint") != FORMAT:
        raise TuiwatchError(f"{p} is not a tuiwatch checkpoint: give a runs/<run>/checkpoints/step-<N>.pt")
    replica_of = None
    if isinstance(data.get("replica_of"), str):
        # A rank of a DDP job saves its weights once per host: they are in the lowest rank's file of the set.
        replica_of = (p.parent / data["replica_of"]).resolve()
        if not replica_of.is_file():
            raise TuiwatchError(
                f"{p} shares its weights with {replica_of}, which is missing: restore from a checkpoint set "
                "taken at one step on every rank (the viewer's c on a job)"
            )
        source = load_checkpoint(replica_of)
        if source.replica_of is not None or source.step != int(data["step"]):
            raise TuiwatchError(f"{replica_of} is not the weights of {p} (another step): not one checkpoint set")
        data["model"], data["optimizer"] = source.model, source.optimizer
    return Checkpoint(
        path=p,
        step=int(data["step"]),
        epoch=int(data["epoch"]),
        batch_index=int(data["batch_index"]),
        opt_steps=int(data["opt_steps"]),
        model=data["model"],
        optimizer=data.get("optimizer"),
        scheduler=data.get("scheduler"),
        scaler=data.get("scaler"),
        rng=data["rng"],
        epoch_rng=data.get("epoch_rng"),
        versions=data.get("versions", {}),
        name=data.get("name"),
        run_id=data.get("run_id"),
        ledger=data.get("ledger"),
        extra=data.get("extra"),
        replica_of=replica_of,
    )


__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "restore_rng", "rng_states", "write_checkpoint"]
