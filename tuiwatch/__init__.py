"""tuiwatch: ``top`` for a PyTorch training run.

Public names resolve lazily, so ``import tuiwatch`` (and the viewer) load no
torch; ``tuiwatch.Watch`` imports the publisher, and torch with it, on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from tuiwatch._version import __version__

if TYPE_CHECKING:
    from tuiwatch.errors import NonFiniteError, StopRequested, TuiwatchError
    from tuiwatch.ledger.reader import read_ledger
    from tuiwatch.microscope.first_nonfinite import first_nonfinite_module
    from tuiwatch.microscope.overfit import overfit_one_batch
    from tuiwatch.publisher.dumps import load_dump
    from tuiwatch.publisher.seeding import seed_everything
    from tuiwatch.publisher.watch import Watch

_PUBLIC = {
    "Watch": "tuiwatch.publisher.watch",
    "NonFiniteError": "tuiwatch.errors",
    "StopRequested": "tuiwatch.errors",
    "TuiwatchError": "tuiwatch.errors",
    "read_ledger": "tuiwatch.ledger.reader",
    "load_dump": "tuiwatch.publisher.dumps",
    "first_nonfinite_module": "tuiwatch.microscope.first_nonfinite",
    "overfit_one_batch": "tuiwatch.microscope.overfit",
    "seed_everything": "tuiwatch.publisher.seeding",
}

__all__ = [
    "NonFiniteError",
    "StopRequested",
    "TuiwatchError",
    "Watch",
    "__version__",
    "first_nonfinite_module",
    "load_dump",
    "overfit_one_batch",
    "read_ledger",
    "seed_everything",
]


# Integrations, as submodules that import their framework only when named: tuiwatch.hf.TuiwatchCallback,
# tuiwatch.lightning.TuiwatchCallback.
_SUBMODULES = {"hf": "tuiwatch.hf", "lightning": "tuiwatch.lightning"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(_SUBMODULES[name])
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tuiwatch' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
