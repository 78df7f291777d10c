"""``tuiwatch relay NAME`` of a job: every local rank's stream on one stdout, labelled, for one ssh per host.

The relay connects to each rank's socket of the job on this host and copies
whole lines only, each run of lines from one rank preceded by a label line
``{"kind": "relay", "rank": k}`` (written only when the rank changes). It
starts with ``{"kind": "relay", "name": ..., "run_id": ..., "world_size": ...,
"ranks": [...], "host": ...}`` and says ``{"kind": "relay", "rank": k,
"closed": REASON}`` when a rank's stream ends. A command line from the viewer
goes to the rank its ``"rank"`` names, or to every rank without one (a run
ignores the field). Nothing is parsed but the command lines' ``rank``: the
records pass through as the ranks wrote them, except that a rank writing more
than :data:`MAX_STEPS_PER_S` step records a second has the rest of that second's
step records left out, and the count said once a second:
``{"kind": "relay", "rank": k, "thinned": N}``. Every other record passes.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import DecodeError, decode, encode
from tuiwatch.wire.discovery import LiveJob
from tuiwatch.wire.protocol import MAX_LINE_BYTES, LineSplitter, ProtocolError, connect

# More step records a second than a viewer can show for one rank (it draws at most a few frames a second, and
# 1,000 points per chart window): beyond it, one ssh carrying 8 fast ranks would carry megabytes a second.
MAX_STEPS_PER_S = 500
STEP_LINE = b'{"kind":"step"'  # how the ledger's codec starts a step record: the kind is its first key


class Thinning:
    """Per rank, at most ``limit`` step records a second pass; the others are counted, and said once a
    second."""

    def __init__(self, limit: int = MAX_STEPS_PER_S, clock: Callable[[], float] = time.monotonic):
        self.limit, self.clock = limit, clock
        self.started: dict[int, float] = {}
        self.passed: dict[int, int] = {}
        self.dropped: dict[int, int] = {}

    def lines(self, rank: int, whole: bytes) -> tuple[bytes, int]:
        """What of ``whole`` (complete lines) to pass on, and how many step records a window that just
        closed left out (0: none)."""
        now, said = self.clock(), 0
        if now - self.started.get(rank, -1e9) >= 1.0:
            said, self.started[rank], self.passed[rank], self.dropped[rank] = self.dropped.get(rank, 0), now, 0, 0
        steps = whole.count(b"\n" + STEP_LINE) + whole.startswith(STEP_LINE)
        if self.passed[rank] + steps <= self.limit:
            self.passed[rank] += steps  # the usual case: nothing parsed, nothing copied
            return whole, said
        kept = []
        for line in whole.splitlines(keepends=True):
            if line.startswith(STEP_LINE):
                if self.passed[rank] >= self.limit:
                    self.dropped[rank] += 1
                    continue
                self.passed[rank] += 1
            kept.append(line)
        return b"".join(kept), said


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def label(**fields: Any) -> bytes:
    return encode({"kind": "relay", **fields})


class _Out:
    """stdout, with a rank label line before each run of one rank's lines."""

    def __init__(self, fd: int):
        self.fd = fd
        self.rank: int | None = None

    def lines(self, rank: int, data: bytes) -> None:
        if rank != self.rank:
            self.rank = rank
            data = label(rank=rank) + data
        write_all(self.fd, data)

    def thinned(self, rank: int, count: int) -> None:
        self.rank = None
        write_all(self.fd, label(rank=rank, thinned=count))

    def closed(self, rank: int, reason: str) -> None:
        self.rank = None
        write_all(self.fd, label(rank=rank, closed=reason))


def relay_job(job: LiveJob, stdin: int, stdout: int) -> int:
    socks: dict[int, socket.socket] = {}
    out = _Out(stdout)
    for run in job.ranks:
        rank = run.rank or 0
        try:
            sock = connect(run.socket, timeout=5.0)
        except OSError as exc:
            for s in socks.values():
                s.close()
            raise TuiwatchError(f"cannot connect to rank {rank} of {job.name}: {exc.strerror or exc}") from None
        sock.settimeout(None)
        socks[rank] = sock
    hello = {"name": job.name, "run_id": job.run_id, "world_size": job.world_size, "host": socket.gethostname()}
    write_all(stdout, label(**hello, ranks=sorted(socks)))
    selector = selectors.DefaultSelector()
    partial: dict[int, bytes] = {}
    for rank, sock in socks.items():
        selector.register(sock, selectors.EVENT_READ, rank)
        partial[rank] = b""
    selector.register(stdin, selectors.EVENT_READ, None)
    commands = LineSplitter(MAX_LINE_BYTES)
    thinning = Thinning()
    try:
        while socks:
            for key, _ in selector.select():
                rank = key.data
                if rank is None:
                    data = os.read(stdin, 1 << 16)
                    if not data:
                        return 0  # the viewer went away
                    for line in commands.feed(data):
                        _route(line, socks)
                    continue
                data = socks[rank].recv(1 << 16)
                if not data:
                    selector.unregister(socks.pop(rank))
                    out.closed(rank, "the run closed the connection")
                    continue
                # Whole lines only: a label between two halves of one record would break both.
                data = partial[rank] + data
                cut = data.rfind(b"\n") + 1
                whole, partial[rank] = data[:cut], data[cut:]
                whole, left_out = thinning.lines(rank, whole)
                if left_out:
                    out.thinned(rank, left_out)
                if whole:
                    out.lines(rank, whole)
        return 0
    except (BrokenPipeError, ProtocolError):
        return 0  # the viewer closed its end, or sent a line no run would take
    finally:
        selector.close()
        for sock in socks.values():
            sock.close()


def _route(line: bytes, socks: dict[int, socket.socket]) -> None:
    try:
        rank = decode(line).get("rank")
    except DecodeError:
        rank = None  # every rank answers it with the error
    targets = [socks[rank]] if type(rank) is int and rank in socks else socks.values() if rank is None else []
    for sock in targets:
        with contextlib.suppress(OSError):  # that rank's stream ends too, and is said so
            sock.sendall(line + b"\n")
