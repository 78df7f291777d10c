"""The machine: memory that only grows, an allocation that failed, a rank that lags."""

from __future__ import annotations

import statistics
from collections import deque
from itertools import pairwise

from tuiwatch.ledger.fields import num
from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule

MiB = 1 << 20


class MemoryGrowth(Rule):
    """Memory grows steadily over training steps: allocated device memory on CUDA, the process RSS on the CPU.

    Leaks grow with every step; healthy runs grow in steps (an eval pass, the
    allocator warming up, a cache filling) and then stay. So each series
    (step ``mem_allocated``, system ``rss``) is indexed by training step, not
    by time: samples taken while no step ran (an eval pass, a checkpoint) fold
    into one point, the latest. The window is the last half of the run (of
    the last ``history`` points): at least ``window`` points over at least
    ``min_steps`` steps, after ``grace`` start-up points. Split into quarters,
    it fires when every quarter's median is above the previous one by about
    even amounts (the smallest rise at least a third of the largest and at
    least ``need / 6``), the last quarter at least ``need`` above the first,
    where ``need`` = max(``min_growth`` × the first quarter, ``min_bytes``).
    A step change raises one quarter and no other; growth that slows to a
    plateau raises the first quarters most. Clears when that stops.
    """

    id = "memory-growth"
    kinds = ("step", "system")

    def __init__(
        self,
        window: int = 16,
        min_steps: int = 200,
        grace: int = 5,
        min_growth: float = 0.05,
        min_bytes: int = 32 * MiB,
        history: int = 256,
    ):
        super().__init__()
        self.window, self.min_steps, self.grace = window, min_steps, grace
        self.min_growth, self.min_bytes = min_growth, min_bytes
        self.history = history
        self.series: dict[str, deque[tuple[int | None, float]]] = {}
        self.seen: dict[str, int] = {}
        self.step: int | None = None

    def _add(self, record: Record) -> str | None:
        """Add this record's sample to its series; the series' name, or None if the record has none."""
        if record.get("kind") == "step":
            step = record.get("step")
            self.step = step if isinstance(step, int) else self.step
            name, value = "mem_allocated", num(record.get("mem_allocated"))
        else:
            name, value = "rss", num(record.get("rss"))
        if value is None:
            return None
        points = self.series.setdefault(name, deque(maxlen=self.history))
        if points and self.step is not None and points[-1][0] == self.step:
            points[-1] = (self.step, value)  # no training step since the last sample: the same point
            return name
        self.seen[name] = self.seen.get(name, 0) + 1
        if self.seen[name] <= self.grace:
            return None
        points.append((self.step, value))
        return name

    def _recent(self, name: str) -> list[tuple[int | None, float]] | None:
        """The last half of the run's points, if it is long enough to judge."""
        points = list(self.series.get(name, ()))
        last = points[-1][0] if points else None
        if last is None:
            recent = points[-self.window :]  # no step known (a ledger of system records only): by sample
            return recent if len(recent) == self.window else None
        recent = [(s, v) for s, v in points if s is not None and s >= last / 2]
        first = recent[0][0] if recent else None
        if len(recent) < self.window or first is None or last - first < self.min_steps:
            return None
        return recent

    def _growth(self, name: str) -> tuple[float, float, list[int]] | None:
        """(first-quarter median, last-quarter median, the steps) when the series grows steadily."""
        recent = self._recent(name)
        if recent is None:
            return None
        values = [v for _, v in recent]
        n = len(values)
        medians = [statistics.median(values[i * n // 4 : (i + 1) * n // 4]) for i in range(4)]
        rises = [b - a for a, b in pairwise(medians)]
        need = max(self.min_growth * medians[0], self.min_bytes)
        steady = min(rises) >= max(need / 6, max(rises) / 3)
        if steady and medians[-1] - medians[0] >= need:
            return medians[0], medians[-1], [s for s, _ in recent if s is not None]
        return None

    def check(self, record: Record) -> AlertRecord | None:
        name = self._add(record)
        found = None if name is None else self._growth(name)
        if name is None or found is None:
            return None
        first, last, steps = found
        span = f" over steps {steps[0]}-{steps[-1]}" if steps else f" over the last {self.window} samples"
        what = "allocated device memory" if name == "mem_allocated" else "process RSS"
        return alert_record(
            self.id,
            "warning",
            self.step,
            f"{what} grows with every step: {first / MiB:,.0f} → {last / MiB:,.0f} MiB{span}",
            {
                "series": name,
                "from_bytes": first,
                "to_bytes": last,
                "from_step": steps[0] if steps else None,
                "to_step": steps[-1] if steps else None,
            },
            "something keeps tensors alive from step to step: a list or dict that grows (append loss.item(), "
            "not loss), backward(retain_graph=True); watch.log(loss=loss) keeps nothing",
        )

    def clears(self, record: Record) -> bool:
        name = self._add(record)
        return name is not None and self._recent(name) is not None and self._growth(name) is None


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
        if len(self.times) < 2:
            return None  # one rank (every single process): no medians to compare
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
