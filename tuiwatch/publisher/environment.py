"""What it takes to rerun this: versions, and the switches that change the arithmetic.

One place for the run record, the checkpoints and the dumps.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

import torch

from tuiwatch._version import __version__

# The environment libraries whose import makes a process a reinforcement-learning loop (rules/__init__.py).
RL_ENVIRONMENTS = ("gymnasium", "gym")


def reinforcement_learning() -> str | None:
    """The environment library this process has imported, if any: the loop trains a policy on rollouts."""
    return next((name for name in RL_ENVIRONMENTS if name in sys.modules), None)


def versions() -> dict[str, Any]:
    """python, torch, numpy, tuiwatch, CUDA and cuDNN (None where absent)."""
    cudnn = torch.backends.cudnn
    try:
        import numpy

        numpy_version: str | None = numpy.__version__
    except ImportError:
        numpy_version = None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "numpy": numpy_version,
        "tuiwatch": __version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,  # type: ignore[no-untyped-call]
    }


def environment(seed: int | None) -> dict[str, Any]:
    """The versions, the host and command line, the seed and the determinism switches."""
    cudnn = torch.backends.cudnn
    return {
        **versions(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "seed": seed,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "cudnn_benchmark": bool(cudnn.benchmark),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
    }
