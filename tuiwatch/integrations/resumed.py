"""A framework's resumed run: its ledger goes on from the framework's step and links to the run that saved.

Lightning and the Hugging Face Trainer restore their own checkpoints (tuiwatch
does not load them: ``Watch(resume_from=...)`` is for its own). What joins the
two ledgers travels with the framework's checkpoint: the earlier run's ledger,
id, name and rank (:func:`saved_state`), in the callback's state that
Lightning saves in every checkpoint, and for the Trainer in a small file beside
its ``trainer_state.json``, one per rank (:data:`SIDECAR`). On resume the new
ledger's steps start at the framework's count of optimizer steps (one ledger
step per optimizer step in both) and a ``resumed`` record links back, as
``watch.restore()`` writes one, so that ``tuiwatch report`` reads the run whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuiwatch.ledger.ranks import rank_ledgers
from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.watch import Watch

SIDECAR = "tuiwatch-rank{rank}.json"  # in a Trainer checkpoint's directory


def saved_state(watch: Watch | None) -> dict[str, Any]:
    """What a framework checkpoint keeps of this run (plain JSON); empty without a ledger file."""
    if watch is None or watch.ledger_path is None:
        return {}
    record = watch.run_record
    return {
        "ledger": str(watch.ledger_path),
        "run_id": record["run_id"],
        "name": watch.name,
        "rank": record["rank"],
        "step": watch.steps,
    }


def link(saved: Any, *, step: int, checkpoint: str | None, rank: int) -> dict[str, Any]:
    """The ``resumed`` record's link: the framework's checkpoint and step, and the earlier ledger of this rank
    where the checkpoint names one (the ledger of another rank is mapped to this rank's in the same job)."""
    out: dict[str, Any] = {"checkpoint": checkpoint, "step": step, "opt_steps": step}
    if not isinstance(saved, Mapping) or not isinstance(saved.get("ledger"), str):
        return out
    ledger: str | None = saved["ledger"]
    if saved.get("rank") != rank:
        # Both frameworks save the state of rank 0 only: this rank's ledger is its sibling in the job's directory.
        own = rank_ledgers(Path(saved["ledger"]).parent.parent).get(rank)
        ledger = None if own is None else str(own)
    out.update(ledger=ledger, run_id=saved.get("run_id"), name=saved.get("name"))
    return out


def write_sidecar(checkpoint_dir: str, watch: Watch | None) -> None:
    """The Trainer saved ``checkpoint_dir``: this rank's link beside it (never fails the Trainer's save)."""
    state = saved_state(watch)
    if not state or not os.path.isdir(checkpoint_dir):
        return
    name = SIDECAR.format(rank=state["rank"])
    try:
        with Directory.open(Path(checkpoint_dir)) as where:
            tmp = f".{name}.{os.getpid()}.tmp"
            where.remove(tmp)
            where.write(tmp, json.dumps(state).encode())
            where.sync(tmp)
            where.move_into_place(tmp, name)
    except OSError:
        pass  # a checkpoint without the link still resumes; its ledger starts a new chain


def read_sidecar(checkpoint_dir: str, rank: int) -> dict[str, Any] | None:
    """The link a Trainer checkpoint holds for ``rank`` (or for rank 0), or None."""
    for r in dict.fromkeys((rank, 0)):
        try:
            data = json.loads(Path(checkpoint_dir, SIDECAR.format(rank=r)).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None
