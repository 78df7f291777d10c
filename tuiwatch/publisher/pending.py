"""What the training thread collects during one step or one validation, built into a record later.

The training thread sets a few attributes on a fresh :class:`StepState`;
everything that costs (resolving device values, finiteness, rates, the dict
itself) happens in :meth:`StepState.build` on the publisher thread.
"""

from __future__ import annotations

import hashlib
import math
import time
from array import array
from typing import Any, NamedTuple, cast

from tuiwatch.ledger.records import Record, StepRecord
from tuiwatch.publisher.deferred import PendingDuration, any_made, is_ready, number, resolve
from tuiwatch.publisher.measure import BatchInfo

# A step record carries at most this many sample ids: a batch of 200,000 made 1.3 MB lines that no viewer
# would take. The rest is summarised (count and digest); a dump of the batch keeps every id.
MAX_RECORD_IDS = 4096


def ids_digest(ids: list[int]) -> str:
    """A digest of every id of a batch: two runs that drew the same batch have the same one."""
    try:
        data = array("q", ids).tobytes()
    except (OverflowError, TypeError):
        data = repr(ids).encode()  # ids beyond int64: still one digest per batch
    return hashlib.blake2b(data, digest_size=8).hexdigest()


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
    measured = True  # one of the steps ``every`` records (set when the tracker opens it)
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
    micro_batches = 1
    not_compute = 0.0  # inside the step's span but not its work: folded micro-batches' waits, a validation block
    # A loop that marks no steps: when the first forward of an evaluation after the step's update began (its step
    # ends at the next training forward, so what runs from here on is not its compute)
    evaluated_at: float | None = None
    evaluated_mark: Any = None  # ... and on CUDA, a timing event recorded then: the step's device time ends there
    scale: Any = None  # the GradScaler's scale at the step's end
    t_end = 0.0
    # perf_counter() at the phase boundaries: the model's first forward returned, the optimizer began and ended
    forwards = 0
    forward_raised = False  # a forward of the model raised in this step (an OOM, a bad input)
    forward_end: float | None = None
    opt_start: float | None = None
    opt_end: float | None = None
    # On CUDA (a step with ``device_start``): timing events recorded at the same three moments, on the stream
    forward_mark: Any = None
    opt_start_mark: Any = None
    opt_end_mark: Any = None
    # A model watched by its parts (parts.py): the first part called in the step
    first_part: Any = None
    # The forwards whose outputs were checked (the model's micro-batches, its parts' calls) and the sum of their
    # probes (on the device)
    outputs_probed = 0
    output_sum: Any = None

    def __init__(self, step: int, started: float):
        self.step = step
        self.started = started
        self.metrics: dict[str, Any] = {}
        self.folded: list[BatchInfo] = []  # step_per="optimizer": the micro-batches after the first

    def deferred(self) -> list[Any]:
        values = [self.compute_s, self.grad_norm, self.param_norm, self.update_norm, self.forward_probe, self.scale]
        values += self.metrics.values()
        for batch in self.batches():
            values += [batch.finite_probe, batch.tokens]
        if self.lr:
            values += self.lr
        return values

    def ready(self) -> bool:
        return not any_made() or all(is_ready(v) for v in self.deferred())

    def worth_a_record(self) -> bool:
        """One of the steps ``every`` records (or forced), with something in it: a boundary with nothing in it is
        not a step."""
        if not self.measured and not self.step_forced:
            return False
        return self.batch is not None or bool(self.metrics) or self.grad_norm is not None or self.opt_step is not None

    def used(self) -> bool:
        """Whether the loop did anything in the step beyond drawing its batch: a forward, an optimizer step, a value
        logged. A step left open with its batch alone was drawn for another model, or for nothing."""
        return self.forwards > 0 or self.opt_start is not None or bool(self.metrics)

    def batches(self) -> list[BatchInfo]:
        return [] if self.batch is None else [self.batch, *self.folded] if self.folded else [self.batch]

    def phases(self) -> dict[str, Any]:
        """Seconds of the step's phases, when it had one forward and one optimizer step.

        ``backward_s`` runs from the forward's return to the optimizer: under DDP
        it holds the wait at the gradient all-reduce, which is how the rank
        that made the others wait is told from them (docs/distributed.md). On
        the CPU they are host times. On CUDA the host only launches kernels (the
        all-reduce wait happens on the device's stream), so they are read from
        timing events recorded at the same moments, once completed: no sync.
        """
        end, start, stop = self.forward_end, self.opt_start, self.opt_end
        if self.forwards != 1 or end is None or start is None or stop is None or self.micro_batches > 1:
            return _no_phases()
        if end > start:
            # The forward ran inside the optimizer's step: optimizer.step(closure) (Lightning, LBFGS). Its three
            # moments do not split the step into a forward, a backward and an update (a backward of 0 s, an update
            # holding all three, as Lightning's steps read before).
            return _no_phases()
        host = {
            "forward_s": max(end - self.started, 0.0),
            "backward_s": max(start - end, 0.0),
            "optimizer_s": max(stop - start, 0.0),
        }
        marks = (self.device_start, self.forward_mark, self.opt_start_mark, self.opt_end_mark)
        if self.device_start is None or any(mark is None for mark in marks):  # (no device_start: every CPU step)
            return host
        # The step's end event (compute_s) is recorded after these on the same stream: when it is ready, so are
        # they, and build() runs only then.
        return {
            name: number(PendingDuration(marks[i], marks[i + 1], host[name]))
            for i, name in enumerate(("forward_s", "backward_s", "optimizer_s"))
        }

    def build(self) -> StepRecord:
        t = self.t_end or time.time()
        grad_norm = number(self.grad_norm)
        batch = self.batch
        batches = self.batches()
        batch_size, tokens, batch_probe = _batch_totals(batches)
        compute_s = number(self.compute_s)
        total_s = (self.data_wait_s or 0.0) + (compute_s or 0.0)
        mem = self.mem
        forward_probe = number(self.forward_probe)
        param_norm = number(self.param_norm)
        metrics = {name: number(value) for name, value in self.metrics.items()}
        # One dict: the step's identity, then the user's metrics, then tuiwatch's fields (the line's order).
        record: StepRecord = {
            "kind": "step",
            "t": t,
            "step": self.step,
            "epoch": self.epoch,
            **metrics,  # type: ignore[typeddict-item]
            "lr": None if self.lr is None else [number(v) for v in self.lr],
            "grad_norm": grad_norm,
            "grad_norm_clipped": (
                None
                if self.clip_max_norm is None or grad_norm is None
                else bool(grad_norm > self.clip_max_norm or not math.isfinite(grad_norm))
            ),
            "param_norm": param_norm,
            "update_norm": number(self.update_norm),
            "opt_step": self.opt_step,
            "batch_ids": self.batch_ids,
            "batch_shape": batch.shape if batch is not None else None,
            "tokens": tokens,
            "data_wait_s": self.data_wait_s,
            "compute_s": compute_s,
            **self.phases(),
            "examples_per_s": batch_size / total_s if batch_size and total_s > 0 else None,
            "mem_allocated": mem.allocated if mem else None,
            "mem_reserved": mem.reserved if mem else None,
            "mem_peak": mem.peak if mem else None,
            "finite": {
                "batch": _is_finite(batch_probe) if batch_probe is not None else _unprobed(batches),
                "forward": _is_finite(forward_probe),
                "loss": _is_finite(metrics.get("loss")),
                "grad": _is_finite(grad_norm),
                "param": _is_finite(param_norm),
            },
            "training": self.training,
        }
        if self.opt_skipped:
            record["opt_skipped"] = True
        if self.oom is not None:
            record["oom"] = self.oom
        if self.classes is not None:
            record["classes"] = self.classes
        if self.micro_batches > 1:
            record["micro_batches"] = self.micro_batches
        if self.batch_ids is not None and len(self.batch_ids) > MAX_RECORD_IDS:
            record["batch_ids"] = self.batch_ids[:MAX_RECORD_IDS]
            record["batch_ids_count"] = len(self.batch_ids)
            record["batch_ids_digest"] = ids_digest(self.batch_ids)
        if self.scale is not None:
            record["scale"] = resolve(self.scale)
        return record


def _no_phases() -> dict[str, float | None]:
    return {"forward_s": None, "backward_s": None, "optimizer_s": None}


def _unprobed(batches: list[BatchInfo]) -> bool | None:
    """The batch boundary of a step whose batches gave no probe: true when they hold no float tensor; null where
    no tensor was found in one at all (an object whose tensors are not walked: their finiteness is not known), one
    has a part not read that may hold a NaN (a DGL graph, an object of one's own), a loader or the loop changed
    one before it was probed (late_probes.py), or no batch was seen."""
    for b in batches:
        if not b.seen or b.overwritten or b.unread:
            return None
    return True if batches else None


def _batch_totals(batches: list[BatchInfo]) -> tuple[int | None, int | None, Any]:
    """Examples, tokens and the finiteness probe of a step's batches (several when micro-batches fold)."""
    if not batches:
        return None, None, None
    if len(batches) == 1:
        b = batches[0]
        return b.size, number(b.tokens), b.probe()
    sizes = [b.size for b in batches]
    tokens = [resolve(b.tokens) for b in batches]
    probes = [p for p in (b.probe() for b in batches) if p is not None]
    finite = all(math.isfinite(p) for p in probes)
    return (
        None if None in sizes else sum(cast(list[int], sizes)),
        None if None in tokens else int(sum(tokens)),
        # One micro-batch not finite says so; all finite but one changed before its probe is not known.
        math.nan if not finite else None if not probes or any(b.overwritten or b.unread for b in batches) else 0.0,
    )


class EvalState:
    def __init__(self, step: int, epoch: int):
        self.step = step
        self.epoch = epoch
        self.metrics: dict[str, Any] = {}
        self.training: bool | None = None
        self.forwards = 0  # forwards of the model inside the block: they tell its mode
        self.t_end = 0.0

    def ready(self) -> bool:
        return not any_made() or all(is_ready(v) for v in self.metrics.values())

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
