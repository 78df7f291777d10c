"""Where encoded records go: an append-only file, or a bounded in-memory tail.

Both are addressed by byte offset, so a viewer is a cursor into the ledger:
history and live records come from the same bytes, with no gap and no
duplicate, and a slow viewer costs no memory of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from pathlib import Path
from typing import Protocol


class LedgerStore(Protocol):
    start: int  # first offset still readable
    end: int  # offset after the last complete record

    def append(self, data: bytes) -> None: ...
    def read(self, offset: int, limit: int) -> bytes: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class FileLedger:
    """The append-only ``ledger.jsonl``.

    Each :meth:`append` is whole lines in as few ``write`` calls as the kernel
    allows, so a killed process leaves complete records and at most one torn
    last line, which readers skip.
    """

    def __init__(self, path: Path, mode: int = 0o600, dir_fd: int | None = None):
        """``dir_fd``: the directory ``path`` is in, held open; the file is then opened by name inside it."""
        self.path = path
        name = path.name if dir_fd is not None else str(path)
        # O_NOFOLLOW: a symlink planted where the ledger goes is refused, not written through.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._wfd = os.open(name, flags, mode, dir_fd=dir_fd)
        self._rfd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
        self.start = 0
        self.end = os.fstat(self._wfd).st_size

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        start = self.end
        try:
            while view:
                n = os.write(self._wfd, view)
                self.end += n
                view = view[n:]
        except OSError:
            # A full disk or a file-size limit mid-batch: cut the file back to
            # the last whole record, so the ledger never ends inside a line.
            with contextlib.suppress(OSError):
                os.ftruncate(self._wfd, start)
                self.end = start
            raise

    def read(self, offset: int, limit: int) -> bytes:
        return os.pread(self._rfd, min(limit, self.end - offset), offset)

    def flush(self) -> None:
        os.fsync(self._wfd)

    def close(self) -> None:
        for fd in (self._wfd, self._rfd):
            with contextlib.suppress(OSError):
                os.close(fd)


class MemoryTail:
    """The last ``max_bytes`` of the ledger, kept in memory when there is no file."""

    def __init__(self, max_bytes: int = 4 << 20, start: int = 0):
        self.max_bytes = max_bytes
        self.start = start
        self.end = start
        self._chunks: deque[tuple[int, bytes]] = deque()

    def append(self, data: bytes) -> None:
        if not data:
            return
        self._chunks.append((self.end, data))
        self.end += len(data)
        while self.end - self.start > self.max_bytes and len(self._chunks) > 1:
            offset, chunk = self._chunks.popleft()
            self.start = offset + len(chunk)

    def read(self, offset: int, limit: int) -> bytes:
        offset = max(offset, self.start)
        out = bytearray()
        for chunk_start, chunk in self._chunks:
            chunk_end = chunk_start + len(chunk)
            if chunk_end <= offset:
                continue
            out += chunk[max(0, offset - chunk_start) :]
            if len(out) >= limit:
                break
        return bytes(out[:limit])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._chunks.clear()
