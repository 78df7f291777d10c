"""A metric over steps in bounded memory, whatever the run's length.

Two views of the same points: the last ``recent`` points exactly (for the
"last 1k" and "last 100" windows), and the whole run as at most ``buckets``
min/max buckets whose width doubles when they fill up (for "all"). Drawing
cost depends on the number of buckets, never on the number of steps.
"""

from __future__ import annotations

import bisect
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
    """What one column of dots shows: the range of a metric over the steps that fall in it."""

    x: int  # the dot column, 0 .. dots - 1, on the chart's shared step axis
    step: int  # the last step drawn in it
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

    @property
    def constant(self) -> bool:
        """Every point so far is one value (an lr that never changes), and there are two or more."""
        buckets = self.buckets
        if self.count < 2:
            return False
        value = buckets[0].lo
        return all(b.lo == value and b.hi == value for b in buckets)

    @property
    def first_step(self) -> int | None:
        return self.buckets[0].first if self.buckets else None

    @property
    def end_step(self) -> int | None:
        """The step of the last point drawn (a non-finite one later is not drawn)."""
        return self.recent[-1][0] if self.recent else None

    def at(self, step: int) -> tuple[int, float] | None:
        """The point a cursor at ``step`` reads, a record's own step and value: the last one kept at or before it
        (every point among the run's last ``recent``; further back, each bucket's last), or in the first bucket,
        its last. None before the first point."""
        recent, buckets = self.recent, self.buckets
        if recent and step >= recent[0][0]:
            i = bisect.bisect_right(recent, step, key=lambda p: p[0]) - 1
            return recent[i] if i >= 0 else None
        if not buckets or step < buckets[0].first:
            return None
        i = max(bisect.bisect_right(buckets, step, key=lambda b: b.last) - 1, 0)
        return buckets[i].last, buckets[i].value

    def value_at(self, step: int) -> float | None:
        """The value a cursor at ``step`` reads (:meth:`at`), None before the first point."""
        point = self.at(step)
        return None if point is None else point[1]

    def after(self, step: int) -> int | None:
        """The step of the first point kept after ``step`` (as :meth:`at` reads them: further back than the last
        ``recent``, a bucket's last), None past the last."""
        recent, buckets = self.recent, self.buckets
        if recent and step >= recent[0][0]:
            i = bisect.bisect_right(recent, step, key=lambda p: p[0])
            return recent[i][0] if i < len(recent) else None
        i = bisect.bisect_right(buckets, step, key=lambda b: b.last)
        return buckets[i].last if i < len(buckets) else None

    def columns(self, start: int, end: int, dots: int) -> list[Column]:
        """The points in steps ``start`` .. ``end``, as at most ``dots`` columns placed on that shared axis.

        Every series of a chart is placed on the same axis: a step lands at the
        same x whichever series it belongs to (an eval every 500 steps sits over
        the train loss of that step). Runs at every frame for every line: one
        pass, no objects per point.
        """
        if dots <= 0 or not self.recent or end < start:
            return []
        exact = len(self.recent) == self.count  # every point of the run is still kept exactly
        scale = (dots - 1) / (end - start) if end > start else 0.0
        by_x: dict[int, list[float]] = {}  # x → [lo, hi, value, step]
        if exact or start >= self.recent[0][0]:
            for s, v in self.recent:
                if s < start or s > end:
                    continue
                x = int((s - start) * scale + 0.5)
                cell = by_x.get(x)
                if cell is None:
                    by_x[x] = [v, v, v, s]
                else:
                    if v < cell[0]:
                        cell[0] = v
                    elif v > cell[1]:
                        cell[1] = v
                    cell[2], cell[3] = v, s
        else:
            for b in self.buckets:
                if b.last < start or b.first > end:
                    continue
                x = int((max(b.first, start) - start) * scale + 0.5)
                cell = by_x.get(x)
                if cell is None:
                    by_x[x] = [b.lo, b.hi, b.value, b.last]
                else:
                    if b.lo < cell[0]:
                        cell[0] = b.lo
                    if b.hi > cell[1]:
                        cell[1] = b.hi
                    cell[2], cell[3] = b.value, b.last
        return [Column(x, int(c[3]), c[0], c[1], c[2]) for x, c in sorted(by_x.items())]
