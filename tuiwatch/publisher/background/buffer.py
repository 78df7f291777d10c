"""What the training thread hands to the publisher thread: bounded, in order, never waited on with a sync.

The training thread calls :meth:`RecordBuffer.put`, which appends under a
lock held for two list operations; when the buffer is full the oldest item is
dropped and counted. When ``wake_at`` items wait, ``put`` wakes the publisher
thread once (``on_wake``) instead of leaving them to its next period. The publisher thread takes what is ready
(:meth:`RecordBuffer.take_ready`): plain records, and pending records whose
device values have arrived, in order. A record still waiting for its CUDA
events holds back the ones after it, up to :data:`MAX_WAIT_S`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

from tuiwatch.ledger.records import Record


class PendingRecord(Protocol):
    """A record whose values may still be on the device."""

    def ready(self) -> bool: ...
    def build(self) -> Record: ...


Item = Record | PendingRecord

# How long a record may wait for its device values before it is written with
# what is there: longer than any sane step (a run whose GPU step takes 20 s
# still gets every value), while a CUDA stream that never completes delays
# only the step records, never the thread, the viewers or other records.
MAX_WAIT_S = 60.0
# At close and at a sync, how long the last records may wait for theirs.
FINAL_WAIT_S = 1.0
# Items that wake the publisher thread before its period ends: a fast loop's records are diagnosed while the
# batches they name are still among the last RECENT_BATCHES (dumps.py) that a dump can save.
WAKE_AT = 10**9


class RecordBuffer:
    def __init__(self, capacity: int, on_wake: Callable[[], None] | None = None):
        self.capacity = capacity
        self.on_wake = on_wake
        self.wake_at = WAKE_AT
        self._woken = False  # woken since the last take: one wake-up is enough
        self.dropped = 0
        self._lock = threading.Lock()
        self._items: deque[Item] = deque()
        self._syncs: list[threading.Event] = []
        self._head_since: float | None = None  # since when the first item has waited for its device values

    # --- training thread -------------------------------------------------------------

    def put(self, item: Item) -> None:
        with self._lock:
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            wake = len(self._items) >= self.wake_at and not self._woken
            self._woken = self._woken or wake
        if wake and self.on_wake is not None:
            self.on_wake()

    def add_sync(self, done: threading.Event) -> None:
        """``done`` is set once everything put before it has been written."""
        with self._lock:
            self._syncs.append(done)

    # --- publisher thread ------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    def take_syncs(self) -> list[threading.Event]:
        with self._lock:
            syncs, self._syncs = self._syncs, []
        return syncs

    def take_ready(self, final: bool) -> list[Item]:
        """The items to build now, in order.

        ``final`` (close, sync): every item, each polled for its device
        values for up to :data:`FINAL_WAIT_S` in all. Otherwise: up to the first
        item that is not ready, unless that one has waited :data:`MAX_WAIT_S`.
        """
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._woken = False
        if final:
            until = time.monotonic() + FINAL_WAIT_S
            for item in items:
                pending = _pending(item)
                while pending is not None and not pending.ready() and time.monotonic() < until:
                    time.sleep(0.001)  # device values polled, never waited on with a sync
            self._head_since = None
            return items
        for index, item in enumerate(items):
            pending = _pending(item)
            if pending is None or pending.ready():
                self._head_since = None
                continue
            now = time.monotonic()
            self._head_since = self._head_since or now
            if now - self._head_since < MAX_WAIT_S:
                # Keep order: this item and all after it wait for the next cycle.
                with self._lock:
                    self._items.extendleft(reversed(items[index:]))
                return items[:index]
            self._head_since = None
        return items

    def clear(self) -> None:
        """In a forked child: what the parent put is not the child's to write."""
        self._items = deque()

    def release_syncs(self) -> None:
        """At the thread's end: everything that will ever be written is."""
        for done in self.take_syncs():
            done.set()


def _pending(item: Item) -> PendingRecord | None:
    """The item if its values may still be on the device; None for a record that is already built."""
    return None if isinstance(item, dict) else cast(PendingRecord, item)
