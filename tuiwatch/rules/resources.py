"""The machine: memory that only grows, an allocation that failed, a rank that lags."""

from __future__ import annotations

import statistics
from collections import deque

from tuiwatch.ledger.fields import num
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule

MiB = 1 << 20


class MemoryGrowth(Rule):
    """Memory grows steadily: allocated device memory per step on CUDA, the process RSS on the CPU.

    Each series (step ``mem_allocated``, system ``rss``) keeps its last
    ``window`` samples after skipping ``grace`` start-up samples. Fires when
    the window's thirds have rising medians, the last third is above the first
    by at least ``min_growth`` (fraction) and ``min_bytes``, and the last third
    still grows over the middle by a third of that: memory that grows and then
    plateaus does not fire. Clears when the window stops growing.
    """

    id = "memory-growth"
    kinds = ("step", "system")

    def __init__(self, window: int = 20, grace: int = 5, min_growth: float = 0.05, min_bytes: int = 32 * MiB):
        super().__init__()
        self.window, self.grace, self.min_growth, self.min_bytes = window, grace, min_growth, min_bytes
        self.series: dict[str, deque[float]] = {}
        self.seen: dict[str, int] = {}
        self.step: int | None = None

    def _growth(self, record: Record) -> tuple[str, float, float] | None:
        """(series, first-third median, last-third median) when this record completes a growing window."""
        if record.get("kind") == "step":
            self.step = record.get("step")
            name, value = "mem_allocated", num(record.get("mem_allocated"))
        else:
            name, value = "rss", num(record.get("rss"))
        if value is None:
            return None
        self.seen[name] = self.seen.get(name, 0) + 1
        if self.seen[name] <= self.grace:
            return None
        values = self.series.setdefault(name, deque(maxlen=self.window))
        values.append(value)
        if len(values) < self.window:
            return None
        third = self.window // 3
        ordered = list(values)
        first, middle, last = (statistics.median(ordered[i * third : (i + 1) * third]) for i in range(3))
        grown = last - first
        need = max(self.min_growth * first, self.min_bytes)
        if first < middle < last and grown >= need and last - middle >= need / 3:
            return name, first, last
        return None

    def check(self, record: Record) -> AlertRecord | None:
        found = self._growth(record)
        if found is None:
            return None
        name, first, last = found
        what = "allocated device memory" if name == "mem_allocated" else "process RSS"
        return alert_record(
            self.id,
            "warning",
            self.step,
            f"{what} keeps growing: {first / MiB:,.0f} → {last / MiB:,.0f} MiB over the last {self.window} samples",
            {"series": name, "from_bytes": first, "to_bytes": last, "samples": self.window},
            "something keeps tensors alive across steps: log loss.item() or loss.detach(), not loss; "
            "look for lists or dicts that grow",
        )

    def clears(self, record: Record) -> bool:
        name = "mem_allocated" if record.get("kind") == "step" else "rss"
        if num(record.get(name)) is None:
            return False
        return self._growth(record) is None and len(self.series.get(name, ())) == self.window


class Oom(Rule):
    """An allocation failed inside a watched step; the publisher recorded it in the step's ``oom`` field."""

    id = "oom"

    def check(self, record: Record) -> AlertRecord | None:
        oom = record.get("oom")
        if not isinstance(oom, dict):
            return None
        shape, tokens = record.get("batch_shape"), record.get("tokens")
        allocated, reserved = num(oom.get("mem_allocated")), num(oom.get("mem_reserved"))
        memory = "" if allocated is None else f"; {allocated / MiB:,.0f} MiB allocated, "
        memory += "" if reserved is None else f"{reserved / MiB:,.0f} MiB reserved"
        rss = num(oom.get("rss"))
        memory += "" if rss is None else f"; process RSS {rss / MiB:,.0f} MiB"
        return alert_record(
            self.id,
            "critical",
            record.get("step"),
            f"out of memory at step {record.get('step')} with batch {shape}"
            + (f" ({tokens} tokens)" if tokens is not None else "")
            + memory,
            {"batch_shape": shape, "tokens": tokens, "batch_ids": record.get("batch_ids"), **oom},
            "the batch dims or token count at failure: bucket by length, cap the sequence, or lower the batch size",
        )

    def clears(self, record: Record) -> bool:
        return record.get("kind") == "step" and "oom" not in record


class Straggler(Rule):
    """One rank's step time is far above the other ranks' (records carry their ``rank``).

    Only a stream that merges several ranks' records feeds this rule (a single
    process sees one rank). Keeps each rank's last ``window`` step times
    (data wait + compute); fires when the slowest rank's median exceeds
    ``ratio`` × the median of the other ranks' medians.
    """

    id = "straggler"

    def __init__(self, window: int = 50, ratio: float = 1.5, min_steps: int = 20):
        super().__init__()
        self.window, self.ratio, self.min_steps = window, ratio, min_steps
        self.times: dict[int, deque[float]] = {}

    def _slowest(self, record: Record) -> tuple[int, float, float] | None:
        rank = record.get("rank")
        wait, compute = num(record.get("data_wait_s")), num(record.get("compute_s"))
        if type(rank) is not int or wait is None or compute is None:
            return None
        self.times.setdefault(rank, deque(maxlen=self.window)).append(wait + compute)
        ready = {r: statistics.median(v) for r, v in self.times.items() if len(v) >= self.min_steps}
        if len(ready) < 2:
            return None
        slow = max(ready, key=ready.__getitem__)
        others = statistics.median(v for r, v in ready.items() if r != slow)
        return slow, ready[slow], others

    def check(self, record: Record) -> AlertRecord | None:
        found = self._slowest(record)
        if found is None or found[1] <= self.ratio * found[2]:
            return None
        rank, slow, others = found
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"rank {rank} takes {slow * 1000:.1f} ms a step, "
            f"{slow / others:.1f}x the other ranks ({others * 1000:.1f} ms)",
            {"rank": rank, "step_s": slow, "others_step_s": others},
            "that rank's loader and host: data wait, CPU contention, a slower GPU or link",
        )

    def clears(self, record: Record) -> bool:
        found = self._slowest(record)
        return found is not None and found[1] <= self.ratio * found[2]
