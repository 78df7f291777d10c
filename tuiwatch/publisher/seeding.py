"""``seed_everything``: one call that seeds python, numpy, torch and the loader's workers, and says what it did."""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from typing import Any

import torch

_last: dict[str, Any] | None = None


@dataclass
class Seeded:
    """What :func:`seed_everything` set, and the two things a DataLoader needs to follow it."""

    seed: int
    generator: torch.Generator  # DataLoader(..., generator=seeded.generator): the shuffle and the workers' seeds
    record: dict[str, Any]

    @staticmethod
    def worker_init_fn(worker_id: int) -> None:
        """DataLoader(..., worker_init_fn=...): seeds python and numpy in each worker from torch's worker seed."""
        seed = torch.initial_seed() % 2**32
        random.seed(seed)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(seed)


def seed_everything(seed: int, deterministic: bool = False) -> Seeded:
    """Seed python ``random``, numpy (when installed), torch (CPU and every CUDA device).

    ``deterministic=True`` also turns on ``torch.use_deterministic_algorithms``
    (ops without a deterministic version then raise), cuDNN's deterministic
    mode without benchmarking, and sets ``CUBLAS_WORKSPACE_CONFIG`` if unset;
    it says so on stderr. A ``Watch`` created afterwards records all of it in
    its ``run`` record (``seeding``).
    """
    global _last
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"seed_everything needs an integer seed in [0, 2**63), got {seed!r}")
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
        seeded_numpy = True
    except ImportError:
        seeded_numpy = False
    torch.manual_seed(seed)  # every CUDA device too
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        print(
            "tuiwatch: deterministic algorithms on (torch.use_deterministic_algorithms(True), cuDNN deterministic, "
            "no benchmark): ops without a deterministic version will raise",
            file=sys.stderr,
        )
    record = {
        "seed": seed,
        "python": True,
        "numpy": seeded_numpy,
        "torch": True,
        "cuda": torch.cuda.is_available(),
        "deterministic": deterministic,
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    _last = record
    return Seeded(seed, torch.Generator().manual_seed(seed), record)


def last_seeding() -> dict[str, Any] | None:
    """What the last :func:`seed_everything` call in this process set, for the run record."""
    return dict(_last) if _last is not None else None
