"""The ledger file after a full disk: what it missed, and writing again once it can.

When the file refuses a write (disk full, quota, file-size limit), the
pipeline serves viewers from memory and hands the file over to a
:class:`DiskGap`. It counts the records the file did not get, tries the file
again about once a second, and on the first write that succeeds puts a
``gap`` record first, saying what is missing, then carries on appending. A
second failure starts a new gap. The file therefore always ends on a record
boundary, and a reader can tell a run that lost records from one that did not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.records import GapRecord, Record
from tuiwatch.ledger.writer import FileLedger
from tuiwatch.publisher.atomic import modes

RETRY_S = 1.0


class DiskGap:
    def __init__(self, path: Path, error: str, retry_s: float = RETRY_S):
        self.path = path
        self.retry_s = retry_s
        self.file: FileLedger | None = None
        self._error = error
        self._next_try = time.monotonic() + retry_s
        self._reset()

    def _reset(self) -> None:
        self.lost = 0
        self._first_step: int | None = None
        self._last_step: int | None = None
        self._first_t: float | None = None
        self._last_t: float | None = None

    def lost_records(self, records: Sequence[Record]) -> None:
        """``records`` reached the viewers but not the file."""
        self.lost += len(records)
        for r in records:
            step, t = integer(r.get("step")), num(r.get("t"))
            if r.get("kind") == "step" and step is not None:
                self._first_step = step if self._first_step is None else self._first_step
                self._last_step = step
            if t is not None:
                self._first_t = t if self._first_t is None else self._first_t
                self._last_t = t

    def append(self, records: Sequence[Record], data: bytes, *, now: float, retry_now: bool = False) -> None:
        """Write ``data`` to the file if it takes it (after a ``gap`` record); else count it as lost."""
        if self.file is None and (retry_now or now >= self._next_try):
            self._next_try = now + self.retry_s
            with contextlib.suppress(OSError):
                self.file = FileLedger(self.path, modes()[1])
        if self.file is None:
            self.lost_records(records)
            return
        head = encode(self._gap_record()) if self.lost else b""
        try:
            self.file.append(head + data)  # one write: on failure the file is cut back before the gap record
        except OSError as exc:
            self._error = f"{type(exc).__name__}: {exc}"[:500]
            self.file.close()
            self.file = None
            self.lost_records(records)
            return
        if head:
            self._reset()

    def _gap_record(self) -> GapRecord:
        return {
            "kind": "gap",
            "t": time.time(),
            "records": self.lost,
            "steps": None if self._first_step is None else [self._first_step, self._last_step],
            "from_t": self._first_t,
            "to_t": self._last_t,
            "error": self._error,
        }

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
