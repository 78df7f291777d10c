"""The viewer's only I/O: where records come from, and where commands go.

A source runs its reading on a thread of its own and posts messages to the
app (``post_message`` is thread-safe). Records are posted in batches, at most
every ``BATCH_S``, so that a run writing 10,000 records a second costs the
app a few messages a second, not ten thousand.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from textual.message import Message

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.chain import earlier_parts
from tuiwatch.ledger.codec import DecodeError, decode
from tuiwatch.ledger.reader import ledger_path, read_ledger
from tuiwatch.ledger.records import Record
from tuiwatch.viewer.messages import (
    RecordsReceived,
    SourceConnected,
    SourceDisconnected,
    SourceEnded,
    SourceProgress,
    SourceUntrusted,
)
from tuiwatch.wire.protocol import LineSplitter, ProtocolError, command_line, connect
from tuiwatch.wire.socketdir import SocketId, socket_ids
from tuiwatch.wire.tcp import HandshakeError, HandshakeInterrupted, TcpTarget, connect_tcp, format_address

BATCH_S = 0.03
MAX_LINE = 1 << 20  # a record longer than this is a broken or hostile peer
Post = Callable[[Message], object]


class Source(Protocol):
    label: str
    live: bool  # commands can be sent

    def start(self, post: Post) -> None: ...
    def send(self, cmd: str, cmd_id: int, at: int | None = None) -> bool: ...
    def stop(self) -> None: ...


def reading_thread(run: Callable[[Post], object], post: Post, name: str) -> threading.Thread:
    """A source's thread: whatever stops it, the viewer is told, never left waiting at "connecting"."""

    def guarded() -> None:
        try:
            run(post)
        except Exception as exc:  # a bug or an input nobody foresaw: said in the viewer, not a silent death
            post(SourceDisconnected(f"the reader stopped: {type(exc).__name__}: {str(exc)[:200]}"))

    return threading.Thread(target=guarded, name=name, daemon=True)


class _Batcher:
    """Collects decoded records and posts them at most every BATCH_S."""

    def __init__(self, post: Post):
        self.post = post
        self.splitter = LineSplitter(MAX_LINE, skip_long=True)
        self.pending: list[Record] = []
        self.last_post = time.monotonic()
        self.skipped = 0

    def feed(self, data: bytes) -> None:
        for line in self.splitter.feed(data):
            if not line.strip():
                continue
            try:
                self.pending.append(decode(line))
            except DecodeError:
                continue
        if self.splitter.skipped > self.skipped:
            # A record over the limit (a 200,000-sample batch's ids, say) is left out and said, not fatal.
            self.skipped = self.splitter.skipped
            self.pending.append(
                {
                    "kind": "alert",
                    "rule": "viewer",
                    "severity": "warning",
                    "step": None,
                    "message": f"{self.skipped} record(s) over {MAX_LINE >> 20} MiB skipped: not shown",
                    "next_check": "a record that large is a bug of the writer (tuiwatch caps what it writes)",
                }
            )

    def flush(self, force: bool = False) -> None:
        if self.pending and (force or time.monotonic() - self.last_post >= BATCH_S):
            self.post(RecordsReceived(self.pending))
            self.pending = []
            self.last_post = time.monotonic()


class FindRun(Protocol):
    def __call__(self, name: str, skip: Collection[SocketId]) -> Path | None: ...


class SocketSource:
    """A live run on this host; reconnects (with back-off) when a run of the same name comes back.

    A run that was already listening beside the one watched is not one that came back: two Watches of one name in
    one process (a generator and a discriminator), or two jobs of one name, run side by side, and a viewer on one
    must not slide onto the other when its run ends. Such runs are noted at each connection and skipped by ``find``.
    """

    live = True

    def __init__(self, path: Path, name: str | None, find: FindRun | None = None):
        self.path = path
        self.name = name
        self.label = str(path)
        self._find = find
        self._beside: frozenset[SocketId] = frozenset()
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self, post: Post) -> None:
        reading_thread(self._run, post, "tuiwatch-source").start()

    def _run(self, post: Post) -> None:
        delay = 0.1
        while not self._stop.is_set():
            connected = self._connect(post)
            if connected is None:
                self._stop.wait(delay)
                delay = min(delay * 2, 1.0)
                continue
            sock, first = connected
            delay = 0.1
            post(SourceConnected(self.label))
            reason = self._read(sock, first, post)
            with self._lock:
                self._sock = None
            sock.close()
            if self._stop.is_set():
                return
            post(SourceDisconnected(reason))

    def _connect(self, post: Post) -> tuple[socket.socket, bytes] | None:
        """A connection and the stream bytes already read from it, or None to try again later."""
        path = self.path
        if self._find is not None and self.name and not path.exists():
            path = self._find(self.name, self._beside) or path
        try:
            sock = connect(path)
        except OSError:
            return None
        self.path, self.label = path, str(path)
        if self._find is not None:
            self._beside = frozenset(i for i in socket_ids(path.parent) if i[0] != str(path))
        with self._lock:
            self._sock = sock
        return sock, b""

    def _read(self, sock: socket.socket, first: bytes, post: Post) -> str:
        batcher = _Batcher(post)
        batcher.feed(first)
        sock.settimeout(BATCH_S)
        try:
            while not self._stop.is_set():
                try:
                    data = sock.recv(1 << 16)
                except TimeoutError:
                    batcher.flush(force=True)
                    continue
                if not data:
                    return "the run closed the connection"
                batcher.feed(data)
                batcher.flush()
        except ProtocolError:
            return "the run sent a line over 1 MiB"
        except OSError as exc:
            return f"connection lost: {exc.strerror or exc}"
        finally:
            batcher.flush(force=True)
        return "stopped"

    def send(self, cmd: str, cmd_id: int, at: int | None = None) -> bool:
        with self._lock:
            sock = self._sock
            if sock is None:
                return False
            try:
                sock.sendall(command_line(cmd, cmd_id, at))
            except OSError:
                return False
        return True

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)


class RanksSource:
    """The ranks of one job, every message tagged with its rank: a source per rank (a :class:`SocketSource`
    for a rank on this host, a :class:`FileSource` for a replay of a job directory), and a
    :class:`RelaySource` per other host (one ssh carrying all of that host's ranks).

    Each rank's source reads on its own thread (a rank on this host reconnects on its own, found again by its
    name and rank): one rank or host that goes away or stalls never holds up the others' records.
    """

    def __init__(
        self,
        name: str,
        world_size: int,
        sources: Mapping[int, Source] | None = None,
        relays: Sequence[RelaySource] = (),
    ):
        self.name = name
        self.world_size = world_size
        self.sources = dict(sorted((sources or {}).items()))
        self.relays = list(relays)
        self._route: dict[int, Callable[[str, int, int | None], bool]] = {r: s.send for r, s in self.sources.items()}
        for relay in self.relays:
            for rank in relay.ranks:
                self._route[rank] = functools.partial(relay.send_to, rank)
        hosts = f" on {len(self.relays) + bool(self.sources)} hosts" if self.relays else ""
        self.label = f"{name}: {len(self._route)} of {world_size} ranks{hosts}"
        self.live = bool(self.relays) or any(s.live for s in self.sources.values())

    @classmethod
    def on_this_host(
        cls, name: str, world_size: int, sockets: Mapping[int, Path], find: FindRank | None = None
    ) -> RanksSource:
        return cls(name, world_size, {r: SocketSource(p, name, _finder(find, r)) for r, p in sockets.items()})

    @classmethod
    def of_job_dir(cls, ledgers: Mapping[int, Path], name: str, world_size: int, follow: bool = False) -> RanksSource:
        return cls(name, world_size, {rank: FileSource(path, follow=follow) for rank, path in ledgers.items()})

    @property
    def ranks(self) -> list[int]:
        return sorted(self._route)

    def start(self, post: Post) -> None:
        for rank, source in self.sources.items():
            source.start(_tagging(post, rank))
        for relay in self.relays:
            relay.start(post)

    def send(self, cmd: str, cmd_id: int, at: int | None = None) -> bool:
        """Send to every rank (one id: each rank is its own process); whether any rank took it."""
        sent = [self.send_to(rank, cmd, cmd_id, at) for rank in self.ranks]
        return any(sent)

    def send_to(self, rank: int, cmd: str, cmd_id: int, at: int | None = None) -> bool:
        return self._route[rank](cmd, cmd_id, at)

    def stop(self) -> None:
        for source in self.sources.values():
            source.stop()
        for relay in self.relays:
            relay.stop()


class RelaySource:
    """One host's ranks of a job through ``ssh host tuiwatch relay RUN_ID``: one stream, split by the relay's
    label lines (:mod:`tuiwatch.wire.job_relay`) into each rank's records.

    A host that dies without closing the connection sends nothing more: its ranks turn stale in the ranks
    pane, and nothing here waits on it but this thread.
    """

    live = True

    def __init__(self, argv: list[str], host: str, ranks: Sequence[int]):
        self.argv = argv
        self.host = host
        self.ranks = sorted(ranks)
        self.label = f"{host}: ranks {', '.join(map(str, self.ranks))}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self, post: Post) -> None:
        reading_thread(lambda p: self._run(p), post, "tuiwatch-relay").start()

    def _run(self, post: Post) -> None:
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            for rank in self.ranks:
                _tagging(post, rank)(SourceDisconnected(f"cannot run {self.argv[0]}: {exc.strerror or exc}"))
            return
        self._proc = proc
        for rank in self.ranks:
            _tagging(post, rank)(SourceConnected(f"{self.host}: rank {rank}"))
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        splitter = LineSplitter(MAX_LINE, skip_long=True)
        pending: dict[int, list[Record]] = {}
        open_ranks: set[int] = set(self.ranks)
        current: int | None = None
        reason = "the relay ended"

        last_flush = time.monotonic()

        def flush() -> None:
            nonlocal last_flush
            for rank, records in pending.items():
                if records:
                    _tagging(post, rank)(RecordsReceived(records))
            pending.clear()
            last_flush = time.monotonic()

        try:
            while True:
                # At most every BATCH_S, whether the stream pauses or never does.
                ready, _, _ = select.select([fd], [], [], BATCH_S)
                if not ready or time.monotonic() - last_flush >= BATCH_S:
                    flush()
                if not ready:
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                for line in splitter.feed(data):
                    try:
                        record = decode(line)
                    except DecodeError:
                        continue
                    if record.get("kind") != "relay":
                        if current is not None and current in open_ranks:
                            pending.setdefault(current, []).append(record)
                        continue
                    labelled = record.get("rank")
                    if type(labelled) is not int:
                        continue  # the relay's first line: what it serves (known from ls already)
                    current = labelled
                    if "thinned" in record and labelled in open_ranks:
                        pending.setdefault(labelled, []).append(record)  # said in the ranks pane
                    if "closed" in record and labelled in open_ranks:
                        flush()
                        open_ranks.discard(labelled)
                        _tagging(post, labelled)(SourceDisconnected(f"{self.host}: {record['closed']}"))
        except OSError as exc:
            reason = f"relay stream broken: {exc}"
        flush()
        reason = _ended(proc, reason)
        for rank in sorted(open_ranks):
            _tagging(post, rank)(SourceDisconnected(f"{self.host}: {reason}"))

    def send_to(self, rank: int, cmd: str, cmd_id: int, at: int | None = None) -> bool:
        return _to_stdin(self._proc, self._lock, command_line(cmd, cmd_id, at, rank))

    def stop(self) -> None:
        _terminate(self._proc)


FindRank = Callable[[str, int, Collection[SocketId]], Path | None]


def _finder(find: FindRank | None, rank: int) -> FindRun | None:
    return None if find is None else lambda name, skip: find(name, rank, skip)


def _tagging(post: Post, rank: int) -> Post:
    def tagged(message: Message) -> object:
        message.rank = rank  # type: ignore[attr-defined]
        return post(message)

    return tagged


class TcpSource(SocketSource):
    """A run reached over its optional TCP listener: the token line, then the Unix socket's protocol."""

    def __init__(self, target: TcpTarget):
        super().__init__(Path(), None)
        self.target = target
        self.label = f"tcp://{format_address(target.host, target.port)}"
        self._said: str | None = None

    def _connect(self, post: Post) -> tuple[socket.socket, bytes] | None:
        try:
            sock, first = connect_tcp(self.target)
        except OSError:
            return None
        except HandshakeInterrupted:
            return None  # evicted by a flood: the next try usually gets through
        except HandshakeError as exc:
            # Said once per spell, not once a second; nothing from that peer is read or believed.
            if str(exc) != self._said:
                self._said = str(exc)
                post(SourceUntrusted(str(exc)))
            return None
        self._said = None
        with self._lock:
            self._sock = sock
        return sock, first


def read_run(path: str | Path) -> list[Record]:
    """Every record of a run's ledger (a file, a run directory, or the newest of a directory of runs), its
    earlier parts first when it was resumed: what ``--compare`` draws. A one-line error when it cannot be read."""
    ledger = ledger_path(path, latest=True)
    try:
        return [*earlier_parts(ledger).records, *read_ledger(ledger)]
    except OSError as exc:
        raise TuiwatchError(f"cannot read {ledger}: {exc.strerror or exc}") from None


class FileSource:
    """A ledger file: read once (replay), or followed as it grows (``--follow``)."""

    live = False

    def __init__(self, path: str | Path, follow: bool = False, poll_s: float = 0.1):
        self.path = ledger_path(path, latest=True)  # a directory of runs: its newest
        self.label = str(self.path)
        self.follow = follow
        self.poll_s = poll_s
        self._stop = threading.Event()

    def start(self, post: Post) -> None:
        reading_thread(self._run, post, "tuiwatch-file").start()

    def _run(self, post: Post) -> None:
        post(SourceConnected(self.label))
        batcher = _Batcher(post)
        try:
            earlier = earlier_parts(self.path)  # a resumed run is shown from its first step
            if earlier.records:
                post(RecordsReceived(earlier.records))
            with open(self.path, "rb") as f:
                total = max(os.fstat(f.fileno()).st_size, 1)
                loading = True
                while not self._stop.is_set():
                    data = f.read(1 << 20)
                    if data:
                        batcher.feed(data)
                        batcher.flush()
                        if loading:
                            post(SourceProgress(min(99, f.tell() * 100 // total)))
                        continue
                    batcher.flush(force=True)
                    if loading:
                        post(SourceProgress(100))  # what was there at the start is read; --follow goes on
                        loading = False
                    if not self.follow:
                        break
                    self._stop.wait(self.poll_s)
        except (OSError, ProtocolError, TuiwatchError) as exc:
            batcher.flush(force=True)
            post(SourceDisconnected(f"cannot read {self.path}: {exc}"))
            return
        post(SourceEnded())

    def send(self, cmd: str, cmd_id: int, at: int | None = None) -> bool:
        return False

    def stop(self) -> None:
        self._stop.set()


class CommandSource:
    """A command that speaks the wire protocol on stdin/stdout, e.g. ``ssh host tuiwatch relay name``."""

    live = True

    def __init__(self, argv: list[str], label: str | None = None):
        self.argv = argv
        self.label = label or " ".join(argv)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self, post: Post) -> None:
        reading_thread(self._run, post, "tuiwatch-command").start()

    def _run(self, post: Post) -> None:
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            post(SourceDisconnected(f"cannot run {self.argv[0]}: {exc.strerror or exc}"))
            return
        self._proc = proc
        post(SourceConnected(self.label))
        batcher = _Batcher(post)
        out: IO[bytes] | None = proc.stdout
        assert out is not None
        reason = "the relay ended"
        try:
            while True:
                # A batch waits at most BATCH_S, also when no further byte comes to push it out.
                if not select.select([out.fileno()], [], [], BATCH_S)[0]:
                    batcher.flush(force=True)
                    continue
                data = os.read(out.fileno(), 1 << 16)
                if not data:
                    break
                batcher.feed(data)
                batcher.flush()
        except (OSError, ProtocolError) as exc:
            reason = f"relay stream broken: {exc}"
        batcher.flush(force=True)
        post(SourceDisconnected(_ended(proc, reason)))

    def send(self, cmd: str, cmd_id: int, at: int | None = None) -> bool:
        return _to_stdin(self._proc, self._lock, command_line(cmd, cmd_id, at))

    def stop(self) -> None:
        _terminate(self._proc)


def _to_stdin(proc: subprocess.Popen[bytes] | None, lock: threading.Lock, line: bytes) -> bool:
    """A command line to a relay's stdin; whether it was written."""
    if proc is None or proc.stdin is None:
        return False
    with lock:
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except OSError:
            return False
    return True


def _ended(proc: subprocess.Popen[bytes], reason: str) -> str:
    """Why a relay's stream ended: its last line on stderr when it failed (ssh's own words), else ``reason``."""
    proc.wait()
    err = proc.stderr.read().decode(errors="replace").strip().splitlines() if proc.stderr else []
    return err[-1] if proc.returncode and err else reason


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
