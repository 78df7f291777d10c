"""``tuiwatch relay NAME`` of a job: every local rank's stream on one stdout, labelled, for one ssh per host.

The relay connects to each rank's socket of the job on this host and copies
whole lines only, each run of lines from one rank preceded by a label line
``{"kind": "relay", "rank": k}`` (written only when the rank changes). It
starts with ``{"kind": "relay", "name": ..., "run_id": ..., "world_size": ...,
"ranks": [...], "host": ...}`` and says ``{"kind": "relay", "rank": k,
"closed": REASON}`` when a rank's stream ends. A command line from the viewer
goes to the rank its ``"rank"`` names, or to every rank without one (a run
ignores the field). Nothing is parsed but the command lines' ``rank``: the
records pass through as the ranks wrote them.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
from typing import Any

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import DecodeError, decode, encode
from tuiwatch.wire.discovery import LiveJob
from tuiwatch.wire.protocol import MAX_LINE_BYTES, LineSplitter, ProtocolError, connect


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
