"""The wire protocol between a run and its viewers.

Transport: one Unix stream socket per training process, at
``<socket dir>/<name>.<pid>.sock`` (see :mod:`tuiwatch.wire.socketdir`),
mode 0600 inside a 0700 directory. The server reads the peer's uid with
``SO_PEERCRED`` on accept and closes a connection of another uid before
sending it one byte.

Server → viewer: JSON Lines, exactly the bytes of the ledger (codec in
:mod:`tuiwatch.ledger.codec`). A connection starts at the ledger's first
record, the ``run`` record, replays the history, and then carries live
records as they are written; order is the ledger's order, with no gap and no
duplicate. A viewer that stops reading is dropped (and counted), never waited
for. Without a ledger file the history is a bounded in-memory tail, sent after
the ``run`` record.

Viewer → server: JSON Lines ``{"cmd": C, "id": N}`` with C one of
:data:`COMMANDS` and N an integer chosen by the viewer, and optionally
``"at": S``: run it at the first step boundary with S steps done (so that
every rank of a job acts at the same step; a run already past S runs it at its
next boundary). Every command gets one ``action`` record in reply, carrying
the same ``id``. A line longer than
:data:`MAX_LINE_BYTES` closes the connection after an error reply; a line
that is not such an object gets an ``action`` reply with ``ok: false``.
Nothing read from a socket is unpickled or evaluated: JSON only.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuiwatch.ledger.codec import DecodeError, decode, encode
from tuiwatch.ledger.records import Decoded
from tuiwatch.wire.address import unix_address

MAX_LINE_BYTES = 64 * 1024
COMMANDS = ("checkpoint", "dump", "pause", "resume", "stop")
_PEERCRED = struct.Struct("3i")


class ProtocolError(ValueError):
    """A line a peer sent that is not a valid command; the message is the reply's ``error``."""


MAX_AT_STEP = 1 << 53  # beyond this a step number is not an integer JSON readers agree on


@dataclass(frozen=True)
class Command:
    cmd: str
    id: int
    at: int | None = None  # steps done before it runs; None: at the next boundary


def parse_command(line: bytes) -> Command:
    """One viewer → server line as a :class:`Command`, or :class:`ProtocolError` saying why not."""
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"command line longer than {MAX_LINE_BYTES} bytes")
    try:
        obj = decode(line)
    except DecodeError as exc:
        raise ProtocolError(f"bad command line: {exc}") from None
    cmd = obj.get("cmd")
    cmd_id = obj.get("id")
    if not isinstance(cmd, str) or cmd not in COMMANDS:
        shown = cmd if isinstance(cmd, str) else type(cmd).__name__
        raise ProtocolError(f"unknown command {shown[:40]!r}: expected one of {', '.join(COMMANDS)}")
    if not isinstance(cmd_id, int) or isinstance(cmd_id, bool):
        raise ProtocolError("command needs an integer 'id'")
    at = obj.get("at")
    if at is not None and (type(at) is not int or not 0 <= at <= MAX_AT_STEP):
        raise ProtocolError("'at' must be a step count: an integer from 0")
    return Command(cmd=cmd, id=cmd_id, at=at)


def command_line(cmd: str, cmd_id: int, at: int | None = None, rank: int | None = None) -> bytes:
    """A command as a line; ``rank`` routes it through a job's relay (a run ignores it)."""
    line: dict[str, object] = {"cmd": cmd, "id": cmd_id}
    if at is not None:
        line["at"] = at
    if rank is not None:
        line["rank"] = rank
    return encode(line)


class LineSplitter:
    """Splits a byte stream into lines, refusing any line over ``limit`` bytes.

    Refusing ends the stream (:class:`ProtocolError`): what a run's server
    does to a viewer that sends a huge command. A viewer reading a run skips
    such a line instead (``skip_long``) and counts it in :attr:`skipped`: one
    oversized record must not cost it the connection and the whole history.
    """

    def __init__(self, limit: int = MAX_LINE_BYTES, skip_long: bool = False):
        self.limit = limit
        self.skip_long = skip_long
        self.skipped = 0
        self._buf = bytearray()
        self._discarding = False  # inside a line already counted as too long: drop bytes up to its newline

    def feed(self, data: bytes) -> list[bytes]:
        """Complete lines in ``data`` (without newline); :class:`ProtocolError` if one is too long."""
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return []
            data, self._discarding = data[nl + 1 :], False
        self._buf += data
        lines = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if len(line) > self.limit:
                self._too_long()
                continue
            lines.append(line)
        if len(self._buf) > self.limit:
            self._too_long()
            self._buf.clear()
            self._discarding = True
        return lines

    def _too_long(self) -> None:
        if not self.skip_long:
            raise ProtocolError(f"line longer than {self.limit} bytes")
        self.skipped += 1


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    _pid, uid, _gid = _PEERCRED.unpack(raw)
    return int(uid)


def connect(path: str | Path, timeout: float = 2.0) -> socket.socket:
    """A connected client socket to a run of this user's; OSError when nothing listens there.

    The server's uid is checked (``SO_PEERCRED``) before a byte is read or
    sent: a socket another user planted (in a socket directory they made
    first, or by a path given on the command line) is not a run to believe,
    nor one to send commands to.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with unix_address(path) as address:
            sock.connect(address)
        uid = peer_uid(sock)
    except OSError:
        sock.close()
        raise
    if uid != os.getuid():
        sock.close()
        raise PermissionError(f"{path} is served by uid {uid}, not by you: not trusted (another user's socket?)")
    return sock


def iter_records(sock: socket.socket, limit: int = 16 * MAX_LINE_BYTES, first: bytes = b"") -> Iterator[Decoded]:
    """Records read from a connected socket until the server closes it (``first``: bytes already read).

    Lines that do not decode are skipped; a line over ``limit`` bytes ends the
    stream (a hostile or broken peer cannot make the reader grow without bound).
    """
    splitter = LineSplitter(limit)
    data = first
    while True:
        data = data or sock.recv(1 << 16)
        if not data:
            return
        try:
            lines = splitter.feed(data)
        except ProtocolError:
            return
        data = b""
        for line in lines:
            try:
                yield decode(line)
            except DecodeError:
                continue
