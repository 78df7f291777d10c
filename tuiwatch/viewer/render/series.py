"""A metric over steps in bounded memory, whatever the run's length.

Two views of the same points: the last ``recent`` points exactly (for the
"last 1k" and "last 100" windows), and the whole run as at most ``buckets``
min/max buckets whose width doubles when they fill up (for "all"). Drawing
cost depends on the number of buckets, never on the number of steps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass
class Bucket:
    first: int
    last: int
    lo: float
    hi: float
    value: float  # the last value in the bucket

    def merge(self, other: Bucket) -> Bucket:
        return Bucket(self.first, other.last, min(self.lo, other.lo), max(self.hi, other.hi), other.value)


@dataclass(frozen=True)
class Column:
    """What one drawing column shows: the range of a metric over a span of steps."""

    step: int
    lo: float
    hi: float
    value: float


class Series:
    def __init__(self, buckets: int = 1024, recent: int = 1000):
        self.max_buckets = buckets
        self.width = 1
        self.buckets: list[Bucket] = []
        self.recent: deque[tuple[int, float]] = deque(maxlen=recent)
        self.last_step: int | None = None
        self.count = 0

    def add(self, step: int, value: float) -> None:
        if self.last_step is not None and step <= self.last_step:
            return  # a replayed or duplicated point (e.g. after a reconnect)
        if not math.isfinite(value):
            # Non-finite values are shown as the alert they are, not drawn.
            self.last_step = step
            return
        self.last_step = step
        self.count += 1
        self.recent.append((step, value))
        tail = self.buckets[-1] if self.buckets else None
        if tail is not None and step < (tail.first // self.width + 1) * self.width:
            # In place: this runs for every point of every series, 10,000 times a second.
            tail.last = step
            tail.value = value
            if value < tail.lo:
                tail.lo = value
            elif value > tail.hi:
                tail.hi = value
        else:
            self.buckets.append(Bucket(step, step, value, value, value))
            if len(self.buckets) > self.max_buckets:
                self._halve()

    def _halve(self) -> None:
        self.width *= 2
        merged: list[Bucket] = []
        for b in self.buckets:
            if merged and b.first // self.width == merged[-1].first // self.width:
                merged[-1] = merged[-1].merge(b)
            else:
                merged.append(b)
        self.buckets = merged

    @property
    def current(self) -> float | None:
        return self.recent[-1][1] if self.recent else None

    def window(self, last: int | None, columns: int) -> list[Column]:
        """At most ``columns`` columns covering the last ``last`` steps (None: the whole run)."""
        if columns <= 0 or not self.recent:
            return []
        end = self.recent[-1][0]
        exact = len(self.recent) == self.count  # every point of the run is still kept exactly
        start = self.buckets[0].first if last is None else max(end - last + 1, self.buckets[0].first)
        if exact or start >= self.recent[0][0]:
            points = [Bucket(s, s, v, v, v) for s, v in self.recent if s >= start]
        else:
            points = [b for b in self.buckets if b.last >= start]
        return _columns(points, start, end, columns)


def _columns(points: list[Bucket], start: int, end: int, columns: int) -> list[Column]:
    span = max(end - start + 1, 1)
    n = min(columns, span)
    lo: list[float | None] = [None] * n
    hi = [0.0] * n
    last = [0.0] * n
    step = [0] * n
    for p in points:
        i = min(max(p.first - start, 0) * n // span, n - 1)
        current = lo[i]
        if current is None:
            lo[i], hi[i] = p.lo, p.hi
        else:
            lo[i] = min(current, p.lo)
            hi[i] = max(hi[i], p.hi)
        last[i], step[i] = p.value, p.last
    return [Column(step[i], low, hi[i], last[i]) for i, low in enumerate(lo) if low is not None]
