"""The loop around the model: a loader that keeps it waiting, evaluation in training mode."""

from __future__ import annotations

from collections import deque
from itertools import pairwise

from tuiwatch.ledger.records import AlertRecord, Record, alert_record
from tuiwatch.rules.base import Rule


class DataBound(Rule):
    """Waiting for data takes most of the time: over ``share`` of the wall time of the last ``window`` steps.

    Time-weighted, not a count of steps: with one slow worker or shard, every
    third batch waits 130 ms and the others 1 ms; that is 90 % of the time in
    a third of the steps. The window's longest waits (a tenth of its steps)
    are left out (an epoch start, where every loader worker starts up, is
    not a slow loader), and the share does
    not depend on how fast the machine computes, only on where the time goes.
    A mean wait under ``min_wait_s`` per step is not
    worth a worker, whatever its share of a tiny step. When the steps that do
    wait come at a regular interval, the evidence says so ("every 3rd batch
    waits"), which points at one worker or shard rather than all of them;
    long waits scattered at no regular interval (a busy machine preempting
    the process) do not fire. A loader without workers (the system records'
    ``workers`` 0) has no worker to blame: its dataset makes every Nth batch
    slowly in the training process itself (a buffer refilled, a rollout of
    Lightning's PPO example, a file opened).
    Clears when the share is under ``clear_share``.
    """

    id = "data-bound"
    kinds = ("step", "system")  # the system records say how many loader workers there are

    def __init__(self, window: int = 50, share: float = 0.5, clear_share: float = 0.3, min_wait_s: float = 0.001):
        super().__init__()
        self.window, self.share, self.clear_share, self.min_wait_s = window, share, clear_share, min_wait_s
        self.recent: deque[tuple[int | None, float, float]] = deque()
        self.wait = 0.0
        self.total = 0.0
        self.workers: int | None = None  # the loader's worker processes, from the last system record that says

    def _push(self, record: Record) -> float | None:
        """Add this step to the window; the window's wait share once it is full (None before)."""
        wait, compute = record.get("data_wait_s"), record.get("compute_s")
        if type(wait) is not float or type(compute) is not float or wait < 0 or compute < 0:
            return None
        step = record.get("step")
        recent, window = self.recent, self.window  # (every step record: locals, not attributes)
        recent.append((step if isinstance(step, int) else None, wait, compute))
        self.wait += wait
        self.total += wait + compute
        if len(recent) > window:
            _, old_wait, old_compute = recent.popleft()
            self.wait -= old_wait
            self.total -= old_wait + old_compute
        if len(recent) < window or self.total <= 0:
            return None
        if self.wait / self.window < self.min_wait_s:
            return 0.0
        share = self.wait / self.total
        if share <= self.clear_share:
            return share
        # Without the window's longest waits (a tenth of its steps): an epoch start, where each loader worker
        # starts up, or a cache miss, is not a slow loader.
        longest = sum(sorted((w for _, w, _ in self.recent), reverse=True)[: max(1, self.window // 10)])
        return (self.wait - longest) / (self.total - longest) if self.total > longest else 0.0

    def _pattern(self) -> tuple[str, int | None, bool]:
        """How the waits are spread, and whether that is a loader's: every step, or every Nth (one worker).

        Scattered long waits are not: a process preempted on a busy machine
        waits wherever it happens to be, and in a 1 ms step that is often the
        loader's turn.
        """
        waiting = [s for s, w, c in self.recent if s is not None and w > max(c, self.min_wait_s)]
        if len(waiting) > len(self.recent) // 2:
            return "most batches wait: the loader as a whole is too slow", None, True
        gaps = [b - a for a, b in pairwise(waiting)]
        if len(gaps) >= 2:
            period = max(set(gaps), key=gaps.count)
            if period >= 2 and gaps.count(period) >= 0.8 * len(gaps):
                nth = {2: "2nd", 3: "3rd"}.get(period, f"{period}th")
                if self.workers == 0:
                    return (
                        f"every {nth} batch waits: the dataset makes them in bursts, with no loader workers",
                        period,
                        True,
                    )
                return f"every {nth} batch waits: one slow worker or shard", period, True
        return "a few batches wait long, at no regular interval", None, False

    def _note_workers(self, record: Record) -> None:
        workers = record.get("workers")
        if type(workers) is int:
            self.workers = workers

    def _advice(self, period: int | None) -> str:
        if period and self.workers == 0:
            return (
                "make the batches beside the training: loader workers (num_workers), or the burst's work (a buffer "
                "refilled, a rollout, a file opened) in a thread or process of its own"
            )
        return "more loader workers, lighter transforms, faster storage, pin_memory" + (
            "; find the slow worker or shard" if period else ""
        )

    def check(self, record: Record) -> AlertRecord | None:
        share = self._push(record)
        if share is None or share <= self.share:
            if share is None and record.get("kind") == "system":
                self._note_workers(record)
            return None
        pattern, period, steady = self._pattern()
        if not steady:
            return None
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            f"waiting for data takes {share:.0%} of the time of the last {self.window} steps; {pattern}",
            {
                "data_wait_share": share,
                "window": self.window,
                "wait_s": self.wait,
                "step_time_s": self.total,
                "pattern": pattern,
                "period": period,
                "workers": self.workers,
            },
            self._advice(period),
        )

    def clears(self, record: Record) -> bool:
        if record.get("kind") == "system":
            self._note_workers(record)
            return False  # says nothing of the waits (clear_after is 1: no run of clear records to break)
        share = self._push(record)
        return share is not None and share < self.clear_share


class EvalMode(Rule):
    """Validation ran with the model in training mode (dropout and batch-norm updates on)."""

    id = "eval-mode"
    kinds = ("eval",)

    def check(self, record: Record) -> AlertRecord | None:
        if record.get("training") is not True:
            return None
        return alert_record(
            self.id,
            "warning",
            record.get("step"),
            "eval metrics were logged with model.training == True",
            {"training": True},
            "call model.eval() before validating (and model.train() after)",
        )
