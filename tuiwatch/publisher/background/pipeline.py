"""The publisher's one background thread: resolve, encode, write, serve.

The training thread only calls :meth:`Pipeline.put`, which appends to a
bounded buffer (:mod:`.buffer`). Everything slow (reading device values,
JSON, the file through its :mod:`.sink`, the sockets of the :mod:`.server`,
system sampling) happens here, every ``period_s`` (sooner when
:data:`~.buffer.WAKE_AT` records wait or a socket is ready). What the buffer dropped
reaches the ledger as a ``publisher`` record. An exception in here never
reaches training: the run goes on, the status becomes ``degraded`` and one
warning goes to stderr.
"""

from __future__ import annotations

import contextlib
import functools
import selectors
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from tuiwatch.ledger.records import AlertRecord, EndRecord, PublisherRecord, Record
from tuiwatch.ledger.writer import LedgerStore
from tuiwatch.publisher.background.buffer import WAKE_AT, Item, PendingRecord, RecordBuffer
from tuiwatch.publisher.background.server import Server, TcpListener
from tuiwatch.publisher.background.sink import LedgerSink
from tuiwatch.publisher.background.system import SystemSampler
from tuiwatch.rules import Diagnosis
from tuiwatch.wire.protocol import Command


class OpenStep(PendingRecord, Protocol):
    def worth_a_record(self) -> bool: ...
    def used(self) -> bool: ...


class Counters(NamedTuple):
    """What the ``publisher`` record reports; written when it changes."""

    status: str
    dropped_records: int
    dropped_viewers: int
    refused_peers: int
    viewers: int


# A ledger write or fsync blocked this long is a hung disk: close() stops waiting for it.
STUCK_STORE_S = 1.0
# Records kept in memory for dumps ("the last ledger records").
RECENT_RECORDS = 200
IDLE_WAIT_S = 0.5  # the longest the thread sleeps when nothing happens (the period doubles up to it)
# Most of a cycle's cost is its start (the thread's code and data are cold again after the training thread's
# kernels ran: a 3x512 MLP's step record cost ~450 µs of CPU a cycle at 20 ms, 26 µs timed alone), so records are
# taken in batches: ten times a second, or sooner when the buffer's wake_at of them wait. A viewer redraws 4
# times a second by default, and its commands wake the thread at once.
PERIOD_S = 0.1


class Pipeline:
    def __init__(
        self,
        store: LedgerStore,
        *,
        capacity: int = 10_000,
        period_s: float = PERIOD_S,
        system_interval_s: float | None = 1.0,
        cuda_device: int | None = None,
        diagnosis: Diagnosis | None = None,
    ):
        self.sink = LedgerSink(store)
        self.buffer = RecordBuffer(capacity, on_wake=self._wake)
        self.period_s = period_s
        self._wait_s = period_s
        self.server: Server | None = None
        self.diagnosis = diagnosis
        self.on_alert: Callable[[AlertRecord, list[Record]], str | None] | None = None
        self.recent: deque[Record] = deque(maxlen=RECENT_RECORDS)
        self.status = "ok"
        self.error: str | None = None
        self._end: EndRecord | None = None
        self._then: Callable[[], None] | None = None
        self._collected = False  # closed by the finalizer of a Watch collected unclosed: the end is made here
        # The training thread's open step (set by its StepTracker), which a Watch collected unclosed never ended.
        self.open_step: OpenStep | None = None
        self._stopping = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._sampler = SystemSampler(system_interval_s, cuda_device) if system_interval_s else None
        self._last_counters: Counters | None = None
        self._next_counters = 0.0
        self._thread = threading.Thread(target=self._run, name="tuiwatch-publisher", daemon=True)

    # --- training thread -------------------------------------------------------------

    def put(self, item: Item) -> None:
        self.buffer.put(item)

    def wake_within(self, items: int) -> None:
        """Wake the thread once ``items`` records wait (at most the buffer's :data:`~.buffer.WAKE_AT`)."""
        self.buffer.wake_at = min(max(items, 1), WAKE_AT)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full socket buffer: a wake-up is already pending
            self._wake_w.send(b"x")

    @property
    def dropped_records(self) -> int:
        return self.buffer.dropped

    def serve(
        self,
        listener: socket.socket,
        path: Path,
        run_line: bytes,
        on_command: Callable[[Command], Record | None],
        *,
        tcp_listener: TcpListener | None = None,
        stall_s: float = 5.0,
    ) -> None:
        """Serve viewers on the bound ``listener`` (and ``tcp_listener``); called once, before :meth:`start`."""
        self.server = Server(
            listener,
            path,
            self.sink.store,
            run_line,
            on_command,
            self._selector,
            tcp_listener=tcp_listener,
            stall_s=stall_s,
        )

    def start(self, on_alert: Callable[[AlertRecord, list[Record]], str | None] | None = None) -> None:
        """Start the thread. ``on_alert`` is called on it for each warning or critical alert, with the
        records so far; the path it returns (a dump) joins the alert's evidence."""
        self.on_alert = on_alert
        self._thread.start()

    def close(self, end: EndRecord, timeout_s: float = 2.0) -> bool:
        """Write ``end`` last, flush and stop within ``timeout_s``; False if the thread is stuck.

        Returns sooner when one ledger write or fsync has been blocked for
        :data:`STUCK_STORE_S`: on a hung disk, waiting longer only delays the
        exit of a run whose records are already lost.
        """
        self.close_soon(end)
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive():
            now = time.monotonic()
            busy = self.sink.busy_since
            if now >= deadline or (busy is not None and now - busy >= STUCK_STORE_S):
                break
            self._thread.join(min(0.05, deadline - now))
        return not self._thread.is_alive()

    def close_soon(self, end: EndRecord | None, *, then: Callable[[], None] | None = None) -> None:
        """:meth:`close` without waiting for the thread; ``then`` is called on it after its last write. ``end`` None:
        a finalizer's (it runs on whatever thread collected the Watch, this one included, and has nothing of the
        Watch), ``finished`` with the counts of the last step records."""
        self._end, self._then, self._collected = end, then, end is None
        self._stopping.set()
        self._wake()

    def sync(self, timeout_s: float) -> bool:
        """Wait until everything put so far is built, diagnosed and flushed; False on timeout.

        For the rare moments the training thread must know the ledger holds a
        step (a non-finite stop, an OOM) before it goes on.
        """
        if not self._thread.is_alive():
            return False
        done = threading.Event()
        self.buffer.add_sync(done)
        self._wake()
        return done.wait(timeout_s)

    def abandon_after_fork(self) -> None:
        """In a forked child: never write, serve or flush on the parent's behalf. Nothing here takes a lock: the
        parent's publisher thread may have held any of them at the fork, and no thread of the child releases it."""
        self._stopping = threading.Event()  # (set() takes the event's own lock)
        self._stopping.set()
        self.buffer.clear()
        self.server = None

    # --- pipeline thread ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._guard(self._cycle)
        self._guard(lambda: self._drain(final=True))
        self._guard(self._write_open_step)
        self._guard(self._write_end)
        if self.server is not None:
            self._guard(self.server.close)
        self._guard(self._flush)
        self.sink.close()
        if self._then is not None:
            self._guard(self._then)
        self.buffer.release_syncs()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _cycle(self) -> None:
        events = self._selector.select(self._wait_s)
        for key, mask in events:
            if key.fileobj is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            elif self.server is not None:
                self._guard(functools.partial(self.server.handle, key, mask))
        syncs = self.buffer.take_syncs()
        drained = self._drain(final=bool(syncs))
        # Idle (a paused or finished loop, a long evaluation): wake less and less often, up to IDLE_WAIT_S;
        # the first record or viewer byte brings the period back (6 ms of CPU a second idle at 20 ms, ~1 at 250).
        busy = events or drained or syncs or len(self.buffer)
        self._wait_s = self.period_s if busy else min(self._wait_s * 2, IDLE_WAIT_S)
        if syncs:
            self._flush()
            for done in syncs:
                done.set()
        now = time.monotonic()
        if self._sampler is not None and self._sampler.due(now, idle=self._wait_s >= IDLE_WAIT_S):
            self._append(self._diagnose([self._sampler.sample(now)]))
        if now >= self._next_counters:
            self._next_counters = now + 1.0
            self._write_counters(force=False)
        if self.server is not None:
            self.server.pump()

    def _drain(self, final: bool) -> int:
        """Build, diagnose and append what is ready; how many items were taken."""
        records: list[Record] = []
        for item in self.buffer.take_ready(final):
            if isinstance(item, dict):
                records.append(item)
                continue
            try:
                records.append(item.build())  # type: ignore[union-attr]
            except Exception as exc:  # one bad value must not cost the rest
                self._degrade(exc)
        self._append(self._diagnose(records))
        return len(records)

    def _diagnose(self, records: list[Record]) -> list[Record]:
        """The records with the alerts they raise placed right after them."""
        if self.diagnosis is None:
            return records
        out: list[Record] = []
        for record in records:
            out.append(record)
            self.recent.append(record)
            try:
                alerts = self.diagnosis.feed(record)
            except Exception as exc:  # a broken rule must not cost the ledger
                self._degrade(exc)
                continue
            for found in alerts:
                self._on_alert(found)
                out.append(found)
                self.recent.append(found)
        return out

    def _on_alert(self, found: AlertRecord) -> None:
        if self.on_alert is None or found.get("severity") == "info":
            return
        try:
            path = self.on_alert(found, list(self.recent))
        except Exception as exc:  # a dump that cannot be written must not cost the alert
            self._degrade(exc)
            found["evidence"]["dump_error"] = f"{type(exc).__name__}: {exc}"[:300]
            return
        if path is not None:
            found["evidence"]["dump"] = path

    def _append(self, records: list[Record], *, last: bool = False) -> None:
        error = self.sink.append(records, last=last)
        if error is not None:
            self._degrade(error)

    def _flush(self) -> None:
        self.sink.flush()

    def _counters(self) -> Counters:
        server = self.server.counters if self.server is not None else None
        return Counters(
            self.status,
            self.dropped_records,
            server.dropped_viewers if server else 0,
            server.refused_peers if server else 0,
            server.viewers if server else 0,
        )

    def counters_record(self) -> PublisherRecord:
        c = self._counters()
        return {
            "kind": "publisher",
            "t": time.time(),
            "status": c.status,
            "dropped_records": c.dropped_records,
            "dropped_viewers": c.dropped_viewers,
            "refused_peers": c.refused_peers,
            "viewers": c.viewers,
            "error": self.error,
        }

    def _write_counters(self, force: bool) -> None:
        current = self._counters()
        if force or current != self._last_counters:
            self._last_counters = current
            self._append([self.counters_record()])

    def _write_end(self) -> None:
        self._write_counters(force=False)
        end = self._end_of_collected() if self._collected else self._end
        if end is not None:
            counters = {k: v for k, v in self.counters_record().items() if k not in ("kind", "t")}
            self._append([{**end, **counters}], last=True)

    def _write_open_step(self) -> None:
        """A Watch collected unclosed: the step it had open (the last of a loop that marks no steps) is the run's last,
        its compute time unknown (its end was not seen), unless it holds nothing but a batch drawn (for another model:
        ``tuiwatch run``'s teacher, then its student). A Watch closed by the loop ended it itself."""
        s, self.open_step = self.open_step, None
        if self._collected and s is not None and s.worth_a_record() and s.used():
            self._append(self._diagnose([s.build()]))

    def _end_of_collected(self) -> EndRecord:
        """The end of a Watch collected unclosed: ``steps`` and ``opt_steps`` as the last step records diagnosed say
        them (0 where none does)."""
        steps = opt_steps = 0
        for record in reversed(self.recent):
            if record.get("kind") != "step":
                continue
            steps = steps or record["step"] + 1
            if record.get("opt_step") is not None:
                opt_steps = record["opt_step"]
                break
        return {"kind": "end", "t": time.time(), "reason": "finished", "steps": steps, "opt_steps": opt_steps}

    def _guard(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            self._degrade(exc)

    def _degrade(self, exc: BaseException) -> None:
        first = self.status != "degraded"
        self.status = "degraded"
        self.error = f"{type(exc).__name__}: {exc}"[:500]
        if first:
            print(f"tuiwatch: publisher degraded ({self.error}); training continues", file=sys.stderr)
        # A ledger file that takes no more writes: viewers are served from memory from now on.
        self.sink.fail_over(exc)
        if self.server is not None:
            self.server.store = self.sink.store
