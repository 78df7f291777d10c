"""Where the pipeline's records go: the ledger file, and what happens when the disk refuses them.

Owned by the publisher thread. Normally a :class:`LedgerSink` appends to the
store (the file, or an in-memory tail for ``Watch(run_dir=None)``). When the
file refuses a write (disk full, I/O error), the sink fails over once: viewers
are served from an in-memory tail that continues the file's byte offsets, and
a :class:`DiskGap` retries the file about once a second and writes a ``gap``
record before the records that follow. It also marks each write or fsync in
progress, so that ``close()`` can tell a hung disk and stop waiting.
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Iterator, Sequence

from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.records import Record
from tuiwatch.ledger.writer import FileLedger, LedgerStore, MemoryTail
from tuiwatch.publisher.background.disk_gap import DiskGap

# errnos that mean "this file takes no more writes", as opposed to a bug.
STORE_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS, errno.EBADF, errno.EFBIG)


class LedgerSink:
    def __init__(self, store: LedgerStore):
        self.store = store  # what viewers read: the file, or the memory tail after a failover
        self.disk_gap: DiskGap | None = None  # the ledger file, after it refused a write
        self.busy_since: float | None = None  # when the current ledger write or fsync began

    def append(self, records: Sequence[Record], *, last: bool = False) -> OSError | None:
        """Encode and append ``records``; the error the store raised, if any (the records still reach viewers)."""
        if not records:
            return None
        data = b"".join(encode(r) for r in records)
        try:
            with self._io():
                self.store.append(data)
        except OSError as exc:
            self.fail_over(exc)
            if isinstance(self.store, MemoryTail):
                self.store.append(data)
            if self.disk_gap is not None:
                self.disk_gap.lost_records(records)
            return exc
        if self.disk_gap is not None:
            with self._io():
                self.disk_gap.append(records, data, now=time.monotonic(), retry_now=last)
        return None

    def fail_over(self, exc: BaseException) -> bool:
        """After the file refused a write: keep the stream in memory and retry the file later. True if it did."""
        store = self.store
        if not isinstance(store, FileLedger) or not isinstance(exc, OSError) or exc.errno not in STORE_ERRNOS:
            return False
        store.close()
        self.disk_gap = DiskGap(store.path, f"{type(exc).__name__}: {exc}"[:500])
        self.store = MemoryTail(start=store.end)
        return True

    def flush(self) -> None:
        with self._io():
            self.store.flush()
            if self.disk_gap is not None:
                self.disk_gap.flush()

    def close(self) -> None:
        self.store.close()
        if self.disk_gap is not None:
            self.disk_gap.close()

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        self.busy_since = time.monotonic()
        try:
            yield
        finally:
            self.busy_since = None
