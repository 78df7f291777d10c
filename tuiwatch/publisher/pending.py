"""What the training thread collects during one step or one validation, built into a record later.

The training thread sets a few attributes on a fresh :class:`StepState`;
everything that costs (resolving device values, finiteness, rates, the dict
itself) happens in :meth:`StepState.build` on the publisher thread.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple, cast

from tuiwatch.ledger.records import Finite, Record, StepRecord
from tuiwatch.publisher.deferred import is_ready, resolve
from tuiwatch.publisher.measure import BatchInfo


class DeviceMemory(NamedTuple):
    """The CUDA allocator's counters at the end of a step, in bytes."""

    allocated: int
    reserved: int
    peak: int


def _is_finite(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, list):
        return all(math.isfinite(v) for v in value)
    return math.isfinite(value)


class StepState:
    # Class-level defaults: a step only pays for the attributes it sets.
    epoch = 0
    batch: BatchInfo | None = None
    batch_ids: list[int] | None = None
    data_wait_s: float | None = None
    compute_s: Any = None  # seconds, or a PendingDuration between two CUDA events
    device_start: Any = None  # the CUDA event recorded when the step began
    grad_norm: Any = None
    clip_max_norm: float | None = None
    param_norm: Any = None
    update_norm: Any = None
    lr: list[Any] | None = None
    opt_step: int | None = None
    opt_skipped = False
    forward_probe: Any = None
    training: bool | None = None
    mem: DeviceMemory | None = None
    oom: dict[str, Any] | None = None
    classes: int | None = None
    step_forced = False  # recorded although ``every`` would skip it (an OOM)
    t_end = 0.0

    def __init__(self, step: int, started: float):
        self.step = step
        self.started = started
        self.metrics: dict[str, Any] = {}

    def deferred(self) -> list[Any]:
        values = [self.compute_s, self.grad_norm, self.param_norm, self.update_norm, self.forward_probe]
        values += self.metrics.values()
        if self.batch is not None:
            values += [self.batch.finite_probe, self.batch.tokens]
        if self.lr:
            values += self.lr
        return values

    def ready(self) -> bool:
        return all(is_ready(v) for v in self.deferred())

    def build(self) -> StepRecord:
        t = self.t_end or time.time()
        # On the line, the user's metrics come right after the step's identity.
        line: dict[str, Any] = {"kind": "step", "t": t, "step": self.step, "epoch": self.epoch}
        for name, value in self.metrics.items():
            line[name] = resolve(value)
        grad_norm = resolve(self.grad_norm)
        batch = self.batch
        batch_size = batch.size if batch is not None else None
        compute_s = resolve(self.compute_s)
        total_s = (self.data_wait_s or 0.0) + (compute_s or 0.0)
        mem = self.mem
        forward_probe = resolve(self.forward_probe)
        batch_probe = resolve(batch.finite_probe) if batch is not None else None
        param_norm = resolve(self.param_norm)
        finite: Finite = {
            "batch": True if batch is not None and batch_probe is None else _is_finite(batch_probe),
            "forward": _is_finite(forward_probe),
            "loss": _is_finite(line.get("loss")),
            "grad": _is_finite(grad_norm),
            "param": _is_finite(param_norm),
        }
        record: StepRecord = {
            "kind": "step",
            "t": t,
            "step": self.step,
            "epoch": self.epoch,
            "lr": resolve(self.lr),
            "grad_norm": grad_norm,
            "grad_norm_clipped": (
                None
                if self.clip_max_norm is None or grad_norm is None
                else bool(grad_norm > self.clip_max_norm or not math.isfinite(grad_norm))
            ),
            "param_norm": param_norm,
            "update_norm": resolve(self.update_norm),
            "opt_step": self.opt_step,
            "batch_ids": self.batch_ids,
            "batch_shape": batch.shape if batch is not None else None,
            "tokens": resolve(batch.tokens) if batch is not None else None,
            "data_wait_s": self.data_wait_s,
            "compute_s": compute_s,
            "examples_per_s": batch_size / total_s if batch_size and total_s > 0 else None,
            "mem_allocated": mem.allocated if mem else None,
            "mem_reserved": mem.reserved if mem else None,
            "mem_peak": mem.peak if mem else None,
            "finite": finite,
            "training": self.training,
        }
        if self.opt_skipped:
            record["opt_skipped"] = True
        if self.oom is not None:
            record["oom"] = self.oom
        if self.classes is not None:
            record["classes"] = self.classes
        line.update(record)
        return cast(StepRecord, line)


class EvalState:
    def __init__(self, step: int, epoch: int):
        self.step = step
        self.epoch = epoch
        self.metrics: dict[str, Any] = {}
        self.training: bool | None = None
        self.t_end = 0.0

    def ready(self) -> bool:
        return all(is_ready(v) for v in self.metrics.values())

    def build(self) -> Record:
        t = self.t_end or time.time()
        record: dict[str, Any] = {
            "kind": "eval",
            "t": t,
            "step": self.step,
            "epoch": self.epoch,
        }
        for name, value in self.metrics.items():
            record[name] = resolve(value)
        record["training"] = self.training
        return record
