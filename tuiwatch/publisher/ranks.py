"""Which rank of which job this process is, and where a multi-rank run's ledgers go (docs/distributed.md).

Nothing here talks to the other ranks: each rank reads its identity from the
launcher's environment (torchrun, or an initialised process group) at start,
once. Ranks of one job agree on a ``run_id`` without exchanging anything:
``Watch(run_id=...)``, else torchrun's ``TORCHELASTIC_RUN_ID``, else (a launcher
that gives none) one derived from what every rank of the job on a host shares:
the rendezvous address and the launcher process.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuiwatch.errors import TuiwatchError
from tuiwatch.publisher.atomic import Directory, modes
from tuiwatch.wire.socketdir import safe_name


@dataclass(frozen=True)
class Ranks:
    run_id: str
    rank: int
    local_rank: int
    world_size: int

    @property
    def several(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def rank_and_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except (ImportError, RuntimeError):
        pass  # no usable process group: the launcher's environment says
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)


def _launcher_id() -> str:
    """What every rank of one job on this host shares when no run id is given: the rendezvous and the launcher."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/stat", "rb") as f:  # the launcher's start time: a reused pid is another job
            started = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        started = ""
    key = "|".join((os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), str(parent), started))
    return "job-" + hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def current_ranks(run_id: str | None = None) -> Ranks:
    """This process's place in its job, read once at start."""
    rank, world = rank_and_world()
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id is None:
        if elastic and elastic != "none":  # torchrun's default rendezvous id is the word "none"
            run_id = elastic
        elif world > 1:
            run_id = _launcher_id()
        else:
            run_id = uuid.uuid4().hex[:12]
    return Ranks(run_id=run_id, rank=rank, local_rank=_env_int("LOCAL_RANK", rank), world_size=world)


def job_dir_name(name: str, run_id: str) -> str:
    """The directory all ranks of a job on one host share: ``<name>-<run_id>``."""
    return f"{safe_name(name)}-{safe_name(run_id)[:40]}"


def new_rank_dir(root: Path, name: str, ranks: Ranks) -> Directory:
    """``root/<name>-<run_id>/rank<k>`` for this rank (``-2``, ``-3``… after a restart), held open.

    The job directory is made by whichever rank comes first, 0700, and must be
    a real directory of this user's for every rank (as the run directory of a
    single process is).
    """
    job = root / job_dir_name(name, ranks.run_id)
    try:
        root.mkdir(parents=True, exist_ok=True)
        shared = Directory.open(job, create=True)
    except OSError as exc:
        raise TuiwatchError(
            f"cannot use the run directory {job}: {exc.strerror or exc}; "
            "give Watch(run_dir=...) a directory of your own, or run_dir=None for no ledger file"
        ) from None
    base, n = f"rank{ranks.rank}", 1
    try:
        while True:
            candidate = base if n == 1 else f"{base}-{n}"
            try:
                os.mkdir(candidate, modes()[0], dir_fd=shared.fd)
            except FileExistsError:
                n += 1
                continue
            return Directory.open(job / candidate, shared)
    finally:
        os.close(shared.fd)


def replicated(model: Any, optimizer: Any, world_size: int) -> bool:
    """Whether every rank of the job holds the same model and optimizer states: a DDP job (the same weights,
    the same all-reduced gradients) with a torch.optim optimizer. Not FSDP or ZeRO, whose ranks hold shards."""
    from torch.nn.parallel import DistributedDataParallel

    from tuiwatch.publisher.optimizers import as_list

    if world_size < 2 or not isinstance(model, DistributedDataParallel):
        return False
    return all(type(o).__module__.startswith("torch.optim.") for o in as_list(optimizer))


def holds_shards(model: Any, world_size: int) -> bool:
    """Whether this rank holds shards of the model's parameters (FSDP2's ``fully_shard`` DTensors, FSDP's flat
    parameters): its gradient, parameter and update norms are then its shard's, not the model's. The model's is
    the root of the sum of the ranks' squares, which no rank can read without a collective, and a collective in a
    hook is one the ranks could make apart (a rank that skips a sample for want of memory): none is made."""
    if world_size < 2:
        return False
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed: nothing is sharded
        return False
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return True
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())
