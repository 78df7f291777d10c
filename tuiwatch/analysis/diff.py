"""``tuiwatch diff``: the first step and field where two runs part, and what that points to. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.records import Record

# In the order a step computes them: a difference in an earlier field explains the later ones.
FIELDS = ("batch_ids", "loss", "grad_norm", "lr", "param_norm")
MEANING = {
    "batch_ids": "the runs saw different samples: data order (sampler or loader seed, shuffle, workers)",
    "loss": "same batches, different loss: model init, or nondeterministic forward arithmetic",
    "grad_norm": "same loss, different gradients: nondeterministic backward (atomics, cuDNN algorithms)",
    "lr": "the learning-rate schedule differs",
    "param_norm": "same gradients, different parameters: the update (optimizer state, lr, weight decay)",
    "steps": "one run has steps the other does not: it stopped earlier, or logs with another `every`",
}


@dataclass
class Difference:
    step: int | None
    field: str
    a: Any
    b: Any
    meaning: str

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "field": self.field, "a": self.a, "b": self.b, "meaning": self.meaning}


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    x, y = num(a), num(b)
    if x is not None and y is not None:
        if math.isnan(x) and math.isnan(y):
            return True
        return x == y or math.isclose(x, y, rel_tol=rtol, abs_tol=atol)
    return bool(a == b)


def _steps(records: Iterable[Record]) -> dict[int, Record]:
    return {r["step"]: r for r in records if r.get("kind") == "step" and integer(r.get("step")) is not None}


def first_difference(
    a: Iterable[Record],
    b: Iterable[Record],
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    fields: Sequence[str] = FIELDS,
) -> Difference | None:
    """The first step (then field, in :data:`FIELDS` order) where the runs differ beyond tolerance; None if none."""
    steps_a, steps_b = _steps(a), _steps(b)
    order = [f for f in FIELDS if f in fields] + [f for f in fields if f not in FIELDS]
    for step in sorted(steps_a.keys() & steps_b.keys()):
        ra, rb = steps_a[step], steps_b[step]
        for name in order:
            # ids are compared exactly; numbers within the tolerance
            tol = (0.0, 0.0) if name == "batch_ids" else (rtol, atol)
            if not _close(ra.get(name), rb.get(name), *tol):
                return Difference(step, name, ra.get(name), rb.get(name), MEANING.get(name, "a logged metric differs"))
    only = sorted(steps_a.keys() ^ steps_b.keys())
    if only:
        return Difference(only[0], "steps", len(steps_a), len(steps_b), MEANING["steps"])
    return None
