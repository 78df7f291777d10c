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


PHASES = ("data_wait_s", "forward_s", "backward_s", "optimizer_s")


class Straggler(Rule):
    """One rank holds the others back; the alert names it, and its cause when the phases explain it.

    Fed by a stream that merges several ranks' step records, each tagged with
    its ``rank`` (the viewer, ``report``); a single process sees one rank. Keeps
    each rank's last ``window`` steps; judges every ``every`` steps of the job
    once at least two ranks have ``min_steps``.

    Under DDP every rank's step takes the same time: the fast ranks wait at the
    gradient all-reduce for the slow one, inside their ``backward_s``. So the
    culprit is the rank that waited least there, the one with the smallest
    median ``backward_s`` (TraceML's policy), and the time the others lose is
    ``gap`` = the other ranks' median ``backward_s`` minus the culprit's. With
    buffers (batch norm), DDP also syncs at the start of each forward: the same
    is then read from ``forward_s + backward_s``, and the larger gap counts. It
    fires when the gap is over ``share`` of the step and over ``min_gap_s``.
    The cause is named only when one phase explains at least ``explained`` of
    the gap: the culprit's extra data wait ("input"), or its extra forward time
    ("compute"); otherwise the alert says the phases measured do not explain it
    (host-to-device copies, compute inside backward, the host). Ranks without
    phases (no optimizer hooked, or ranks that never synchronise) are compared
    by step time: the slowest rank's median over ``ratio`` × the others'.
    Clears when the gap is under half its bar (or the step ratio under ``ratio``).
    """

    id = "straggler"

    def __init__(
        self,
        window: int = 50,
        min_steps: int = 20,
        share: float = 0.25,
        min_gap_s: float = 0.002,
        explained: float = 0.5,
        ratio: float = 1.5,
        every: int = 10,
    ):
        super().__init__()
        self.window, self.min_steps, self.share, self.min_gap_s = window, min_steps, share, min_gap_s
        self.explained, self.ratio, self.every = explained, ratio, every
        self.ranks: dict[int, dict[str, deque[float]]] = {}
        self.seen = 0
        self.last: bool | None = None  # the last judgement: a straggler or not (None: too early to say)

    def _push(self, record: Record) -> bool:
        """Fold the record in; whether it is time to judge."""
        rank = record.get("rank")
        if type(rank) is not int:
            return False  # one process's ledger (the usual): nothing to compare
        wait, compute = num(record.get("data_wait_s")), num(record.get("compute_s"))
        if wait is None or compute is None:
            return False
        series = self.ranks.get(rank)
        if series is None:
            series = self.ranks[rank] = {k: deque(maxlen=self.window) for k in ("step_s", "model_s", *PHASES)}
        series["step_s"].append(wait + compute)
        for phase in PHASES:
            value = num(record.get(phase))
            if value is not None:
                series[phase].append(value)
        forward, backward = num(record.get("forward_s")), num(record.get("backward_s"))
        if forward is not None and backward is not None:
            series["model_s"].append(forward + backward)
        self.seen += 1
        # Every `every` steps of the job (records of all ranks): a 64-rank job is judged as often as one of 2.
        return len(self.ranks) >= 2 and self.seen % (self.every * len(self.ranks)) == 0

    def _medians(self) -> dict[int, dict[str, float | None]]:
        ready = {r: v for r, v in self.ranks.items() if len(v["step_s"]) >= self.min_steps}
        return {
            r: {k: statistics.median(d) if len(d) >= self.min_steps else None for k, d in v.items()}
            for r, v in ready.items()
        }

    def _judge(self, record: Record) -> tuple[bool, AlertRecord | None]:
        medians = self._medians()
        if len(medians) < 2:
            return False, None
        if all(m["backward_s"] is not None for m in medians.values()):
            return self._by_phases(record, medians)
        return self._by_step_time(record, medians)

    def _by_phases(
        self, record: Record, medians: dict[int, dict[str, float | None]]
    ) -> tuple[bool, AlertRecord | None]:
        def m(rank: int, key: str) -> float:
            return medians[rank][key] or 0.0

        def least(key: str) -> tuple[float, int]:
            rank = min(medians, key=lambda r: m(r, key))
            return statistics.median(m(r, key) for r in medians if r != rank) - m(rank, key), rank

        # The waits at DDP's syncs: the all-reduce, inside backward_s; with buffers (batch norm) also their
        # broadcast at the start of the forward, inside forward_s + backward_s (model_s). The culprit waited
        # least at whichever shows the larger gap: a slow loader's ranks wait at the first sync they reach,
        # a slow forward's at the all-reduce (their forward + backward come out equal).
        gap, culprit = max(least("backward_s"), least("model_s"))
        others = [r for r in medians if r != culprit]
        step = statistics.median(m(r, "step_s") for r in medians)
        bar = max(self.share * step, self.min_gap_s)
        if gap <= (bar if not self.active else bar / 2):
            return False, None
        extra_wait = m(culprit, "data_wait_s") - statistics.median(m(r, "data_wait_s") for r in others)
        extra_forward = m(culprit, "forward_s") - statistics.median(m(r, "forward_s") for r in others)
        if extra_wait >= self.explained * gap:
            cause, why = "input", f"its data wait is {extra_wait * 1000:.1f} ms longer than theirs"
            advice = "that rank's loader: its shard, workers, storage or transforms"
        elif extra_forward >= self.explained * gap:
            cause, why = "compute", f"its forward takes {extra_forward * 1000:.1f} ms longer than theirs"
            advice = "that rank's device and batch: a slower or throttled GPU, longer sequences in its shard"
        else:
            cause, why = None, "its data wait and forward do not explain it"
            advice = "that rank's host-to-device copies, its backward, or its host (CPU contention, a slower link)"
        alert = alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"rank {culprit} makes the other ranks wait {gap * 1000:.1f} ms a step at the gradient sync "
            f"({gap / step:.0%} of a {step * 1000:.1f} ms step): {why}" + (f" ({cause})" if cause else ""),
            {
                "rank": culprit,
                "cause": cause,
                "gap_s": gap,
                "step_s": step,
                "phase_medians": _phase_table(medians),
            },
            advice,
        )
        return True, alert

    def _by_step_time(
        self, record: Record, medians: dict[int, dict[str, float | None]]
    ) -> tuple[bool, AlertRecord | None]:
        steps = {r: v["step_s"] or 0.0 for r, v in medians.items()}
        slow = max(steps, key=steps.__getitem__)
        others = statistics.median(v for r, v in steps.items() if r != slow)
        if steps[slow] <= self.ratio * others:
            return False, None
        alert = alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"rank {slow} takes {steps[slow] * 1000:.1f} ms a step, "
            f"{steps[slow] / others:.1f}x the other ranks ({others * 1000:.1f} ms)",
            {
                "rank": slow,
                "cause": None,
                "step_s": steps[slow],
                "others_step_s": others,
                "phase_medians": _phase_table(medians),
            },
            "that rank's loader and host: data wait, CPU contention, a slower GPU or link",
        )
        return True, alert

    def check(self, record: Record) -> AlertRecord | None:
        if not self._push(record):
            return None
        self.last, found = self._judge(record)
        return found

    def clears(self, record: Record) -> bool:
        if self._push(record):
            self.last, _ = self._judge(record)
            return not self.last
        return False


# The evidence of a job this large lists its slowest and fastest ranks only: an alert is one line, not a table.
MAX_EVIDENCE_RANKS = 16


def _phase_table(medians: dict[int, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    ranks = sorted(medians, key=lambda r: medians[r]["backward_s"] or medians[r]["step_s"] or 0.0)
    if len(ranks) > MAX_EVIDENCE_RANKS:
        half = MAX_EVIDENCE_RANKS // 2
        ranks = ranks[:half] + ranks[-half:]
    return {str(r): medians[r] for r in sorted(ranks)}
