"""``tuiwatch diff``: how two runs differ, their setup first, then the first step and field where they part. Pure.

Only the steps both runs have are compared (a resumed run starts at its
checkpoint's step; a run that stopped earlier has fewer), and the explanation
offered for a difference is only one the evidence supports: "same batches"
only when both runs recorded batch ids and they agreed, GPU kernel
nondeterminism only when a run was on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuiwatch.ledger.chain import resumed_from
from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.records import Record

# In the order a step computes them: a difference in an earlier field explains the later ones.
FIELDS = ("batch_ids", "loss", "grad_norm", "lr", "param_norm")
# What the run records say about the setup, compared before any step.
RUN_FIELDS = (
    *("argv", "seed", "torch", "cuda", "tuiwatch", "device"),
    *("model", "optimizer", "params", "world_size", "every", "step_per"),
)


@dataclass
class Difference:
    step: int | None
    field: str
    a: Any
    b: Any
    meaning: str

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "field": self.field, "a": self.a, "b": self.b, "meaning": self.meaning}


@dataclass
class Comparison:
    """What ``diff`` found: the setup differences, the step counts, and the first step difference (or None)."""

    setup: list[tuple[str, Any, Any]]
    steps_a: int
    steps_b: int
    common: list[int]
    difference: Difference | None
    unchecked: list[str] = field(default_factory=list)  # fields neither run recorded on the common steps
    resumed: str | None = None  # how one run continues the other, when it does

    @property
    def identical(self) -> bool:
        return bool(self.common) and self.difference is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "setup": [{"field": f, "a": a, "b": b} for f, a, b in self.setup],
            "steps": {"a": self.steps_a, "b": self.steps_b, "common": len(self.common)},
            "difference": None if self.difference is None else self.difference.as_dict(),
            "unchecked": self.unchecked,
            "resumed": self.resumed,
        }


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    x, y = num(a), num(b)
    if x is not None and y is not None:
        if math.isnan(x) and math.isnan(y):
            return True
        return x == y or math.isclose(x, y, rel_tol=rtol, abs_tol=atol)
    return bool(a == b)


def _value(record: Record, name: str) -> Any:
    """What is compared of ``name``: for a batch of more than 4,096 ids, its count and digest of all of them too."""
    value = record.get(name)
    if name == "batch_ids" and record.get("batch_ids_digest") is not None:
        return [value, record.get("batch_ids_count"), record.get("batch_ids_digest")]
    return value


def _ends(ids: list[Any]) -> str:
    if len(ids) <= 8:
        return repr(ids)
    return f"[{', '.join(map(repr, ids[:4]))}, ..., {', '.join(map(repr, ids[-2:]))}]"


def _shown(value: Any) -> str:
    """A value for the one line that names the difference: a long id list as its ends and its length."""
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], list) and isinstance(value[2], str):
        return f"{_ends(value[0])} of {value[1]} ids (digest {value[2]})"
    if isinstance(value, list) and len(value) > 8:
        return f"{_ends(value)} ({len(value)} ids)"
    return repr(value)


def _steps(records: Iterable[Record]) -> dict[int, Record]:
    return {r["step"]: r for r in records if r.get("kind") == "step" and integer(r.get("step")) is not None}


def _run(records: Sequence[Record]) -> Mapping[str, Any]:
    return next((r for r in records if r.get("kind") == "run"), {})


def _is_option(arg: str) -> bool:
    """``--lr`` or ``-v``, not ``-0.5``."""
    if not arg.startswith("-") or len(arg) == 1:
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def options(argv: Any) -> dict[str, Any]:
    """A command line as ``{--option: value}`` (``True`` for a flag) and ``{"#N": positional}``."""
    out: dict[str, Any] = {}
    args = [str(a) for a in argv] if isinstance(argv, list) else []
    i, position = 1, 0  # argv[0] is the script: a path that differs between checkouts says nothing
    while i < len(args):
        arg = args[i]
        if _is_option(arg):
            key, eq, value = arg.partition("=")
            if eq:
                out[key] = value
            elif i + 1 < len(args) and not _is_option(args[i + 1]):
                out[key] = args[i + 1]
                i += 1
            else:
                out[key] = True
        else:
            out[f"#{position}"] = arg
            position += 1
        i += 1
    return out


def setup_differences(run_a: Mapping[str, Any], run_b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, A, B) for each setup field that differs; a command line by option (``--dtype``)."""
    out: list[tuple[str, Any, Any]] = []
    for name in RUN_FIELDS:
        a, b = run_a.get(name), run_b.get(name)
        if name == "argv":
            oa, ob = options(a), options(b)
            out += [(k, oa.get(k), ob.get(k)) for k in sorted(oa.keys() | ob.keys()) if oa.get(k) != ob.get(k)]
        elif a != b and a is not None and b is not None:
            out.append((name, a, b))
    return out


def _resumed(
    run_a: Mapping[str, Any], a: Sequence[Record], run_b: Mapping[str, Any], b: Sequence[Record]
) -> str | None:
    """How one run continues the other: resumed from a checkpoint the other wrote."""
    for who, link, other in (("B", resumed_from(b), run_a), ("A", resumed_from(a), run_b)):
        if link is not None and link.get("run_id") is not None and link.get("run_id") == other.get("run_id"):
            return f"{who} resumed from the other run's checkpoint at step {link.get('step')}"
    return None


def _on_gpu(*runs: Mapping[str, Any]) -> bool:
    return any(str(r.get("device", "")).startswith("cuda") for r in runs)


def meaning(name: str, ids_agreed: bool, gpu: bool, setup: Sequence[tuple[str, Any, Any]]) -> str:
    """What a first difference in ``name`` points to, given what else is known."""
    if setup:
        first = ", ".join(f for f, _, _ in setup[:3])
        lead = f"the runs were set up differently ({first}): start there; "
    else:
        lead = ""
    batches = "same batches, " if ids_agreed else "(no batch ids to tell whether the batches were the same) "
    if name == "batch_ids":
        return lead + "the runs saw different samples: data order (sampler or loader seed, shuffle, workers)"
    if name == "loss":
        return lead + batches + "different loss: model init or the seed, the forward's arithmetic (dtype, kernels)"
    if name == "grad_norm":
        why = (
            "nondeterministic backward kernels on the GPU (atomics, cuDNN algorithm choice)"
            if gpu
            else "on the CPU, a different thread count or torch build changes the reduction order"
        )
        return lead + f"same loss, different gradients: {why}"
    if name == "lr":
        return lead + "the learning-rate schedule differs"
    if name == "param_norm":
        return lead + "same gradients, different parameters: the update (optimizer state, lr, weight decay)"
    return lead + "a logged metric differs"


def compare(
    a: Sequence[Record],
    b: Sequence[Record],
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    fields: Sequence[str] = FIELDS,
) -> Comparison:
    """Compare the runs' setup, then the steps both have, field by field in :data:`FIELDS` order."""
    run_a, run_b = _run(a), _run(b)
    setup = setup_differences(run_a, run_b)
    steps_a, steps_b = _steps(a), _steps(b)
    common = sorted(steps_a.keys() & steps_b.keys())
    order = [f for f in FIELDS if f in fields] + [f for f in fields if f not in FIELDS]
    recorded = {n for n in order if any(steps_a[s].get(n) is not None or steps_b[s].get(n) is not None for s in common)}
    gpu = _on_gpu(run_a, run_b)
    difference = None
    for step in common:
        ra, rb = steps_a[step], steps_b[step]
        ids_agreed = "batch_ids" in order and ra.get("batch_ids") is not None and rb.get("batch_ids") is not None
        for name in order:
            # ids are compared exactly; numbers within the tolerance
            tol = (0.0, 0.0) if name == "batch_ids" else (rtol, atol)
            va, vb = _value(ra, name), _value(rb, name)
            if not _close(va, vb, *tol):
                difference = Difference(step, name, va, vb, meaning(name, ids_agreed, gpu, setup))
                break
        if difference is not None:
            break
    return Comparison(
        setup=setup,
        steps_a=len(steps_a),
        steps_b=len(steps_b),
        common=common,
        difference=difference,
        unchecked=[n for n in order if n not in recorded],
        resumed=_resumed(run_a, a, run_b, b),
    )


def as_text(c: Comparison, fields: Sequence[str]) -> str:
    def span(steps: list[int]) -> str:
        return f" ({steps[0]}-{steps[-1]})" if steps else ""

    lines = [
        f"steps      A has {c.steps_a}, B has {c.steps_b}; {len(c.common)} in common{span(c.common)} are compared"
        + (f" ({c.resumed})" if c.resumed else "")
    ]
    if c.setup:
        lines.append("setup      the runs differ in " + ", ".join(f"{f}: A={a!r} B={b!r}" for f, a, b in c.setup))
    else:
        lines.append("setup      same command line, seed, versions, device and model")
    if not c.common:
        lines.append("no step in common: nothing to compare")
    elif c.difference is None:
        checked = [f for f in fields if f not in c.unchecked]
        lines.append(f"identical: the {len(c.common)} common steps agree on {', '.join(checked) or 'nothing'}")
    else:
        d = c.difference
        lines.append(f"first difference at step {d.step}, field {d.field}: A={_shown(d.a)} B={_shown(d.b)}")
        lines.append(f"  → {d.meaning}")
    if c.unchecked:
        lines.append(f"not recorded by either run, so not compared: {', '.join(c.unchecked)}")
    return "\n".join(lines)


class Parting:
    """The first step where a run A parts from a run B, found as A's records arrive (the viewer's ``--compare``).

    B's values of :data:`FIELDS` are kept for its first ``max_steps`` steps
    (compact: a tuple a step); A's step records are compared as they come, in
    step order, as ``diff`` compares them (exactly); the first difference is
    kept. Steps past ``max_steps`` are not compared, and :meth:`said` says so.
    """

    def __init__(self, b: Iterable[Record], max_steps: int = 100_000):
        self.max_steps = max_steps
        self.run_b: Mapping[str, Any] = {}
        self.b: dict[int, tuple[Any, ...]] = {}
        for r in b:
            kind = r.get("kind")
            if kind == "run" and not self.run_b:
                self.run_b = r
            step = integer(r.get("step"))
            if kind == "step" and step is not None and step < max_steps:
                self.b[step] = tuple(_value(r, name) for name in FIELDS)
        self.reset()

    def reset(self) -> None:
        """A's stream starts over (a reconnect): compare again from its first step."""
        self.run_a: Mapping[str, Any] = {}
        self.compared = 0
        self.last: int | None = None  # the last step of A compared
        self.found: Difference | None = None

    def feed(self, record: Record) -> None:
        kind = record.get("kind")
        if kind == "run":
            self.run_a = record
            return
        step = integer(record.get("step"))
        other = self.b.get(step) if kind == "step" and step is not None and self.found is None else None
        if other is None:
            return
        for name, vb in zip(FIELDS, other, strict=True):
            va = _value(record, name)
            if not _close(va, vb, 0.0, 0.0):
                ids = record.get("batch_ids") is not None and other[FIELDS.index("batch_ids")] is not None
                setup = setup_differences(self.run_a, self.run_b)
                self.found = Difference(step, name, va, vb, meaning(name, ids, _on_gpu(self.run_a, self.run_b), setup))
                return
        self.compared += 1
        self.last = step

    def said(self) -> str:
        """One short phrase for the viewer: where the runs part, or how far they agree."""
        if self.found is not None:
            return f"parts at step {self.found.step} ({self.found.field})"
        if not self.compared:
            return "no common step yet"
        beyond = f" (steps past {self.max_steps:,} not compared)" if (self.last or 0) >= self.max_steps - 1 else ""
        return f"same for {self.compared:,} steps{beyond}"
