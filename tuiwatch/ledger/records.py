"""Record kinds and the fields each kind carries (SPEC §3).

Records are plain dicts on the wire and in the file, so that unknown fields and
kinds written by a newer tuiwatch survive a round trip through an older one.
The tuples below are the contract that tests and docs/ledger.md check against.
"""

from __future__ import annotations

from typing import Any

SCHEMA = 1

Record = dict[str, Any]

KINDS = ("run", "step", "eval", "system", "alert", "action", "end", "publisher")

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
STEP_OPTIONAL_FIELDS = ("opt_skipped", "oom", "classes")

# Names a user cannot log as metrics: they would shadow what tuiwatch measures.
RESERVED_METRIC_NAMES = frozenset(("kind", "t", *STEP_FIELDS, *STEP_OPTIONAL_FIELDS))
