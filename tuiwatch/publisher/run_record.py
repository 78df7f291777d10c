"""The ``run`` record, the first line of a ledger (SPEC §3), and the names a run is filed under."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.records import SCHEMA, RunRecord
from tuiwatch.publisher import environment
from tuiwatch.publisher.atomic import modes
from tuiwatch.publisher.optimizers import optimizer_name
from tuiwatch.publisher.ranks import Ranks, holds_shards
from tuiwatch.publisher.seeding import last_seeding
from tuiwatch.wire.socketdir import parse_socket_name, safe_name


def default_name() -> str:
    """The script's stem: ``train`` for ``python train.py``; the package's name for ``python -m package`` (its
    ``__main__.py``); in a Jupyter kernel, the notebook's (``JPY_SESSION_NAME``, the notebook's path, which
    Jupyter Server gives the kernels it starts), else ``notebook``. Every notebook was "ipykernel_launcher"."""
    argv0 = Path(sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python")
    if argv0.stem == "ipykernel_launcher":
        return Path(os.environ.get("JPY_SESSION_NAME", "")).stem or "notebook"
    if argv0.stem == "__main__":
        return argv0.parent.name or "python"
    return argv0.stem or "python"


def new_run_dir(root: Path, name: str) -> Path:
    """``root/<name>-<YYYYmmdd-HHMMSS>``, with ``-2``, ``-3``… when that exists (ranks, restarts)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{safe_name(name)}-{stamp}"
    candidate, n = base, 1

    def refused(exc: OSError) -> TuiwatchError:
        return TuiwatchError(
            f"cannot create the run directory {candidate}: {exc.strerror}; "
            "give Watch(run_dir=...) a writable directory, or run_dir=None for no ledger file"
        )

    try:
        root.mkdir(parents=True, exist_ok=True)  # the root is the user's: a shared runs/ stays as they made it
    except OSError as exc:
        raise refused(exc) from None
    while True:
        try:
            candidate.mkdir(mode=modes()[0])  # private: the run's argv, weights and batches live here
            return candidate
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        except OSError as exc:
            raise refused(exc) from None


def shared_root_warning(root: Path) -> str | None:
    """One line when another user could swap what is in ``root`` (the run directory's parent): it is theirs,
    or anyone may write to it without the sticky bit. The run directory itself is private either way."""
    try:
        st = root.stat()
    except OSError:
        return None
    if st.st_uid != os.geteuid():
        return f"run_dir {root} belongs to uid {st.st_uid}: its owner can rename this run's directory; use your own"
    if st.st_mode & 0o002 and not st.st_mode & 0o1000:
        return f"run_dir {root} is writable by every user without the sticky bit: use a directory of your own"
    return None


def start_line(
    name: str, ledger: Path | None, socket_path: Path | None, socket_error: str | None, *, world_size: int = 1
) -> str:
    """The one line a Watch prints at start (stderr): where the ledger is and how to watch the run, or why not.

    A job of several ranks prints it once per host (local rank 0), naming the directory its ranks share.
    """
    if world_size > 1 and ledger is not None:
        where = f"{world_size} ranks, ledgers {ledger.parent.parent}/rank*/{ledger.name}"
    else:
        where = f"ledger {ledger}" if ledger is not None else "no ledger file (run_dir=None)"
    if socket_path is not None:
        # Another run of this process has the name (free_socket_path): the name would ask which, the path does not.
        entry = parse_socket_name(socket_path)
        target = name if entry is not None and entry.name == safe_name(name) else str(socket_path)
        # Quoted for a shell where it needs to be: a notebook's name often has spaces.
        return f"tuiwatch: {name}: {where}; watch it with: tuiwatch attach {shlex.quote(target)}"
    replay = f"; replay it with: tuiwatch replay {ledger.parent}" if ledger is not None else ""
    return f"tuiwatch: no live socket for this run ({socket_error}); {name}: {where}{replay}"


def device_total_memory(device: torch.device) -> int | None:
    """The device's memory in bytes, the scale of the pane's memory bars (a property: no sync)."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.get_device_properties(device).total_memory)
    except (RuntimeError, AssertionError):
        return None


def make_run_record(
    *,
    name: str,
    seed: int | None,
    device: torch.device,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    param_count: int | None,
    every: int,
    update_norm_every: int,
    param_norm_every: int,
    on_nonfinite: str,
    rules: list[str] | dict[str, Any] | None,
    rules_note: str | None,
    step_per: str,
    resumed_from: dict[str, Any] | None,
    integration: dict[str, Any] | None,
    run_dir: Path | None,
    socket_path: Path | None,
    socket_error: str | None,
    tcp_address: str | None,
    ranks: Ranks,
) -> RunRecord:
    """Everything known about the run at its start, its Watch's settings last."""
    versions = environment.versions()
    return {
        "kind": "run",
        "t": time.time(),
        "schema": SCHEMA,
        "name": name,
        "run_id": ranks.run_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "rank": ranks.rank,
        "local_rank": ranks.local_rank,
        "world_size": ranks.world_size,
        "argv": list(sys.argv),
        "seed": seed,
        "seeding": last_seeding(),
        "torch": versions["torch"],
        "cuda": versions["cuda"],
        "device": str(device),
        "mem_total": device_total_memory(device),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tuiwatch": versions["tuiwatch"],
        "run_dir": None if run_dir is None else str(run_dir),
        "socket": None if socket_path is None else str(socket_path),
        "socket_error": socket_error,
        "tcp": tcp_address,
        "model": type(getattr(model, "_orig_mod", model)).__name__,  # the compiled model's own class
        "optimizer": None if optimizer is None else optimizer_name(optimizer),
        "params": param_count,
        "sharded": holds_shards(model, ranks.world_size),
        "every": every,
        "update_norm_every": update_norm_every,
        "param_norm_every": param_norm_every,
        "on_nonfinite": on_nonfinite,
        "rules": rules,
        "rules_note": rules_note,
        "step_per": step_per,
        "resumed_from": resumed_from,
        "integration": integration,
    }
