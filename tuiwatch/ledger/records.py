"""Record kinds and the fields each kind carries (SPEC §3, docs/ledger.md).

Records are plain dicts on the wire and in the file, so that unknown fields and
kinds written by a newer tuiwatch survive a round trip through an older one.
A reader takes a :data:`Record` (anything a line decodes to) and reads its
fields through :mod:`tuiwatch.ledger.fields`; a writer builds the kind's
TypedDict below, so that mypy checks every field it sets. The field tuples
are the contract that tests and docs/ledger.md check against.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

SCHEMA = 1

# A record as a reader takes it: any kind, any fields (read them through ledger.fields).
Record = Mapping[str, Any]
# A record as decoded from a line: a fresh dict the reader may keep or change.
Decoded = dict[str, Any]


class RunRecord(TypedDict):
    kind: Literal["run"]
    t: float
    schema: int
    name: str
    run_id: str
    host: str
    pid: int
    rank: int
    local_rank: int  # the rank among this host's ranks (LOCAL_RANK)
    world_size: int
    argv: list[str]
    seed: int | None
    seeding: dict[str, Any] | None
    torch: str
    cuda: str | None
    device: str
    mem_total: int | None
    started: str
    tuiwatch: str
    run_dir: str | None
    socket: str | None
    socket_error: str | None
    tcp: str | None
    model: str
    optimizer: str | None
    params: int | None
    sharded: bool  # this rank holds shards of the parameters (FSDP): its norms are its shard's
    every: int
    update_norm_every: int
    param_norm_every: int
    on_nonfinite: str
    rules: list[str] | dict[str, Any] | None  # Watch(rules=...) as run (None: every rule, its defaults)
    rules_note: str | None  # what the loop's kind changed in them (reinforcement learning), else None
    step_per: str  # "batch" or "optimizer": what one step is
    resumed_from: dict[str, Any] | None  # Watch(resume_from=...): the checkpoint and the run that wrote it
    integration: dict[str, Any] | None  # what an integration (tuiwatch run, a callback) sees and does not


class Finite(TypedDict):
    batch: bool | None
    forward: bool | None
    loss: bool | None
    grad: bool | None
    param: bool | None


class _StepFields(TypedDict):
    kind: Literal["step"]
    t: float
    step: int
    epoch: int
    lr: list[float] | None
    grad_norm: float | None
    grad_norm_clipped: bool | None
    param_norm: float | None
    update_norm: float | None
    opt_step: int | None
    batch_ids: list[int] | None
    batch_shape: Any
    tokens: int | None
    data_wait_s: float | None
    compute_s: float | None
    forward_s: float | None  # the step's phases (host clock): null unless one forward and one optimizer step
    backward_s: float | None  # from the forward's return to the optimizer: under DDP, the all-reduce wait too
    optimizer_s: float | None
    examples_per_s: float | None
    mem_allocated: int | None
    mem_reserved: int | None
    mem_peak: int | None
    finite: Finite
    training: bool | None


class StepRecord(_StepFields, total=False):
    # Only where they apply; the user's metrics (``loss``…) sit beside these.
    opt_skipped: bool
    oom: dict[str, Any]
    classes: int
    micro_batches: int  # step_per="optimizer": the batches folded into this optimizer step
    scale: float  # the GradScaler's loss scale at the step's end
    batch_ids_count: int  # batch_ids holds only the first 4,096 of this many
    batch_ids_digest: str  # blake2b-64 of all the ids (int64, little-endian): equal batches, equal digests


class SystemRecord(TypedDict, total=False):
    kind: Literal["system"]
    t: float
    cpu_percent: float
    rss: int
    workers: int
    workers_cpu_percent: list[float]
    gpus: list[dict[str, Any]] | None
    gpu_error: str | None


class AlertRecord(TypedDict):
    kind: Literal["alert"]
    t: float
    rule: str
    severity: str
    step: int | None
    message: str
    evidence: dict[str, Any]
    next_check: str


class _ActionFields(TypedDict):
    kind: Literal["action"]
    t: float
    id: int | None
    action: str | None
    ok: bool
    path: str | None
    error: str | None
    step: int | None


class ActionRecord(_ActionFields, total=False):
    # What a checkpoint reply adds.
    bytes: int
    steps_done: int
    dump: str
    checkpoint_error: str
    coalesced_with: int  # this id was sent while the same command waited: it shares that one's run


class PublisherRecord(TypedDict):
    kind: Literal["publisher"]
    t: float
    status: str
    dropped_records: int
    dropped_viewers: int
    refused_peers: int
    viewers: int
    error: str | None


class GapRecord(TypedDict):
    kind: Literal["gap"]
    t: float
    records: int
    steps: list[int | None] | None  # [first, last] step the file missed
    from_t: float | None
    to_t: float | None
    error: str | None


class EndRecord(TypedDict):
    """The last line; as it is written, the ``publisher`` record's fields are merged in (docs/ledger.md)."""

    kind: Literal["end"]
    t: float
    reason: str
    steps: int
    opt_steps: int


# Every kind tuiwatch writes; readers keep and ignore any other.
KINDS = ("run", "step", "eval", "system", "alert", "action", "end", "publisher", "gap")

RUN_FIELDS = (
    "schema",
    "name",
    "run_id",
    "host",
    "pid",
    "rank",
    "world_size",
    "argv",
    "seed",
    "torch",
    "cuda",
    "device",
    "started",
    "tuiwatch",
)

# Fields every step record carries; values may be null where SPEC §3 allows it
# (optimizer fields on steps where the optimizer did not step, memory on CPU).
STEP_FIELDS = (
    "step",
    "epoch",
    "lr",
    "grad_norm",
    "grad_norm_clipped",
    "param_norm",
    "update_norm",
    "opt_step",
    "batch_ids",
    "batch_shape",
    "tokens",
    "data_wait_s",
    "compute_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "examples_per_s",
    "mem_allocated",
    "mem_reserved",
    "mem_peak",
    "finite",
    "training",
)

FINITE_BOUNDARIES = ("batch", "forward", "loss", "grad", "param")

SYSTEM_FIELDS = ("cpu_percent", "rss", "workers", "gpus")

END_REASONS = ("finished", "stopped", "nonfinite", "exception", "killed")

# Fields a step record carries only when they apply (docs/ledger.md).
STEP_OPTIONAL_FIELDS = (
    "opt_skipped",
    "oom",
    "classes",
    "micro_batches",
    "scale",
    "batch_ids_count",
    "batch_ids_digest",
)

# Names a user cannot log as metrics: they would shadow what tuiwatch measures.
RESERVED_METRIC_NAMES = frozenset(("kind", "t", *STEP_FIELDS, *STEP_OPTIONAL_FIELDS))
# Fields of an eval record that are not metrics.
EVAL_FIELDS = ("kind", "t", "step", "epoch", "training")


# --- builders: the kinds written in more than one place ------------------------------


def action_record(
    action: str | None,
    *,
    cmd_id: int | None,
    ok: bool,
    step: int | None,
    path: str | None = None,
    error: str | None = None,
) -> ActionRecord:
    """The reply to one command (``id`` is the command's; None for a line that was not a command)."""
    return {
        "kind": "action",
        "t": time.time(),
        "id": cmd_id,
        "action": action,
        "ok": ok,
        "path": path,
        "error": error,
        "step": step,
    }


def alert_record(
    rule: str, severity: str, step: int | None, message: str, evidence: dict[str, Any], next_check: str
) -> AlertRecord:
    return {
        "kind": "alert",
        "t": time.time(),
        "rule": rule,
        "severity": severity,
        "step": step,
        "message": message,
        "evidence": evidence,
        "next_check": next_check,
    }
