"""The run's Unix socket: many viewers, each a cursor into the ledger bytes.

Runs on the pipeline thread only; every socket is non-blocking, so a viewer
that stalls, floods or vanishes costs the run nothing but a closed
connection. Protocol: :mod:`tuiwatch.wire.protocol`; TCP: :mod:`tuiwatch.wire.tcp`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.records import Record, action_record
from tuiwatch.ledger.writer import LedgerStore
from tuiwatch.wire import tcp
from tuiwatch.wire.address import unix_address
from tuiwatch.wire.protocol import Command, LineSplitter, ProtocolError, parse_command, peer_uid

CHUNK_BYTES = 256 * 1024
MAX_VIEWERS = 64
MAX_PENDING_REPLIES = 32


@dataclass
class ServerCounters:
    viewers: int = 0
    dropped_viewers: int = 0
    refused_peers: int = 0


@dataclass
class _Viewer:
    sock: socket.socket
    cursor: int
    last_progress: float
    splitter: LineSplitter = field(default_factory=LineSplitter)
    outbuf: bytearray = field(default_factory=bytearray)
    replies: list[bytes] = field(default_factory=list)
    caught_up: bool = False


@dataclass
class _Unauthenticated:
    """A TCP connection in its handshake: sent nothing before its hello, then only the run's proof."""

    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    viewer_nonce: str | None = None  # set once its hello came, with the run's nonce
    run_nonce: str = ""

    def eviction_order(self) -> tuple[bool, float]:
        """Who goes first when the waiting room is full: those that have not said hello, oldest first."""
        return (self.viewer_nonce is not None, self.deadline)


def bind_tcp(host: str, port: int) -> socket.socket:
    """A non-blocking TCP listener at ``host:port`` (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bind_private_socket(path: Path) -> socket.socket:
    """Listen at ``path`` with mode 0600 from the moment the name exists.

    The socket is bound under a temporary name, narrowed to 0600, made to
    listen, then renamed into place: the final name is never reachable with a
    wider mode, nor there before it listens. A connect to a name that does not
    listen yet is refused, and ``remove_stale_sockets`` removes a live
    process's socket that refuses; ``tuiwatch ls``, the viewer's discovery and
    every Watch at its start call it (the ranks of a job start together): the
    run was left with no socket.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        with unix_address(tmp) as address:
            sock.bind(address)
        os.chmod(tmp, 0o600)
        sock.listen(64)
        os.rename(tmp, path)
        sock.setblocking(False)
    except OSError:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return sock


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), or None if there is none."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass
class TcpListener:
    """The optional TCP listener and the token a peer must send first (see :mod:`tuiwatch.wire.tcp`)."""

    sock: socket.socket
    address: str
    token: str
    token_file: Path


def open_tcp_listener(host: str, port: int, token_file: Path) -> TcpListener:
    """Listen at ``host:port`` and write the token file a viewer needs; raises OSError."""
    listener = bind_tcp(host, port)
    bound_host, bound_port = listener.getsockname()[:2]
    address = tcp.format_address(bound_host, bound_port)
    token = secrets.token_hex(32)
    try:
        tcp.write_token_file(token_file, address, token)
    except OSError:
        listener.close()
        raise
    return TcpListener(listener, address, token, token_file)


class Server:
    """Serves the ledger's bytes to every viewer; built once the listeners are bound and the run line is known."""

    def __init__(
        self,
        listener: socket.socket,
        path: Path,
        store: LedgerStore,
        run_line: bytes,
        on_command: Callable[[Command], Record | None],
        selector: selectors.BaseSelector,
        *,
        tcp_listener: TcpListener | None = None,
        stall_s: float = 5.0,
        lag_bytes: int = 16 << 20,
    ):
        self.path = path
        # The socket file as bound: at close it is removed only if still there. A later Watch of the same name in
        # this process (a sweep's next trial, while a collected one's thread closes) puts its own socket there.
        self._made = _identity(path)
        self.store = store
        self.run_line = run_line
        self.on_command = on_command
        self.stall_s = stall_s
        self.lag_bytes = lag_bytes
        self.counters = ServerCounters()
        self._uid = os.getuid()
        self._listener = listener
        self._viewers: dict[int, _Viewer] = {}
        self.selector = selector
        self.selector.register(self._listener, selectors.EVENT_READ, self._accept)
        self._tcp = tcp_listener
        self._unauthenticated: dict[int, _Unauthenticated] = {}
        if tcp_listener is not None:
            self.selector.register(tcp_listener.sock, selectors.EVENT_READ, self._accept_tcp)

    # --- events -----------------------------------------------------------------

    def handle(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data == self._accept:
            self._accept()
            return
        if key.data == self._accept_tcp:
            self._accept_tcp()
            return
        pending = self._unauthenticated.get(key.fd)
        if pending is not None:
            self._authenticate(pending)
            return
        viewer = self._viewers.get(key.fd)
        if viewer is None:
            return
        if mask & selectors.EVENT_READ:
            self._read(viewer)
        if mask & selectors.EVENT_WRITE and key.fd in self._viewers:
            self._send(viewer)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and friends: refuse this one, keep serving
                self.counters.refused_peers += 1
                return
            try:
                uid_ok = peer_uid(sock) == self._uid
            except OSError:
                uid_ok = False
            if not uid_ok or len(self._viewers) >= MAX_VIEWERS:
                # Closed before a single byte is written to it.
                sock.close()
                self.counters.refused_peers += 1
                continue
            sock.setblocking(False)
            self._add_viewer(sock, b"")

    def _add_viewer(self, sock: socket.socket, first_bytes: bytes) -> None:
        viewer = _Viewer(sock=sock, cursor=self.store.start, last_progress=time.monotonic())
        if self.store.start > 0:  # an in-memory tail lost its head: the run record goes first
            viewer.outbuf += self.run_line
        self._viewers[sock.fileno()] = viewer
        self.selector.register(sock, selectors.EVENT_READ)
        self.counters.viewers = len(self._viewers)
        if first_bytes:
            self._received(viewer, first_bytes)
        else:
            self._send(viewer)

    # --- TCP: a token before anything else ------------------------------------------

    def _accept_tcp(self) -> None:
        assert self._tcp is not None
        while True:
            try:
                sock, _ = self._tcp.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.counters.refused_peers += 1
                return
            if len(self._viewers) >= MAX_VIEWERS:
                sock.close()
                self.counters.refused_peers += 1
                continue
            if len(self._unauthenticated) >= tcp.MAX_PENDING_AUTH:
                # Evicting rather than refusing: silent connections cannot hold every seat against the token's holder.
                self._refuse(min(self._unauthenticated.values(), key=_Unauthenticated.eviction_order))
            sock.setblocking(False)
            pending = _Unauthenticated(sock, time.monotonic() + tcp.AUTH_TIMEOUT_S)
            self._unauthenticated[sock.fileno()] = pending
            self.selector.register(sock, selectors.EVENT_READ)
            self._authenticate(pending)  # a viewer sends its hello with the connect: answer it before the next accept

    def _authenticate(self, pending: _Unauthenticated) -> None:
        try:
            data = pending.sock.recv(tcp.MAX_AUTH_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        pending.received += data
        received = bytes(pending.received)
        line, newline, rest = received.partition(b"\n")
        if not data or not tcp.could_be_hello(received):
            self._refuse(pending)
        elif not newline:
            if len(received) >= tcp.MAX_AUTH_BYTES:
                self._refuse(pending)
        elif pending.viewer_nonce is None:
            self._challenge(pending, line, rest)
        else:
            self._admit(pending, line, rest)

    def _challenge(self, pending: _Unauthenticated, line: bytes, rest: bytes) -> None:
        assert self._tcp is not None
        viewer_nonce = tcp.hello_nonce(line)
        if viewer_nonce is None or rest:
            self._refuse(pending)
            return
        pending.viewer_nonce, pending.run_nonce = viewer_nonce, tcp.new_nonce()
        pending.received.clear()
        run_proof = tcp.proof(self._tcp.token, "run", viewer_nonce, pending.run_nonce)
        try:
            pending.sock.send(encode({"nonce": pending.run_nonce, "proof": run_proof}))  # far below any buffer
        except OSError:
            self._refuse(pending)

    def _admit(self, pending: _Unauthenticated, line: bytes, rest: bytes) -> None:
        assert self._tcp is not None
        assert pending.viewer_nonce is not None
        given = tcp.field_of(line, "proof")
        if not tcp.proof_holds(given, self._tcp.token, "viewer", pending.viewer_nonce, pending.run_nonce):
            with contextlib.suppress(OSError):
                pending.sock.send(encode({"refused": "the token does not match this run's"}))
            self._refuse(pending)
            return
        self._forget(pending)
        try:
            pending.sock.send(encode({"ok": True}))
        except OSError:
            pending.sock.close()
            return
        self._add_viewer(pending.sock, rest)

    def _forget(self, pending: _Unauthenticated) -> None:
        self._unauthenticated.pop(pending.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(pending.sock)

    def _refuse(self, pending: _Unauthenticated) -> None:
        """Close: no ledger byte goes to a peer that has not proved it holds the token."""
        self._forget(pending)
        pending.sock.close()
        self.counters.refused_peers += 1

    def _read(self, viewer: _Viewer) -> None:
        try:
            data = viewer.sock.recv(64 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(viewer, counted=False)
            return
        self._received(viewer, data)

    def _received(self, viewer: _Viewer, data: bytes) -> None:
        try:
            lines = viewer.splitter.feed(data)
        except ProtocolError as exc:
            reply = action_record(None, cmd_id=None, ok=False, step=None, error=f"{exc}; closing connection")
            with contextlib.suppress(OSError):
                viewer.sock.send(encode(reply))
            self._drop(viewer, counted=False)
            return
        for line in lines:
            if not line.strip():
                continue
            try:
                answer = self.on_command(parse_command(line))
            except ProtocolError as exc:
                answer = action_record(None, cmd_id=None, ok=False, step=None, error=str(exc))
            if answer is not None:
                viewer.replies.append(encode(answer))
        if len(viewer.replies) > MAX_PENDING_REPLIES:
            self._drop(viewer, counted=False)
            return
        self._send(viewer)

    # --- sending ------------------------------------------------------------------

    def pump(self) -> None:
        """Move new ledger bytes towards every viewer; drop the stalled and the far behind."""
        now = time.monotonic()
        for waiting in list(self._unauthenticated.values()):
            if now > waiting.deadline:
                self._refuse(waiting)
        for viewer in list(self._viewers.values()):
            self._send(viewer)
            if viewer.sock.fileno() not in self._viewers:
                continue
            pending = bool(viewer.outbuf) or viewer.cursor < self.store.end
            behind = self.store.end - viewer.cursor
            if (
                (pending and now - viewer.last_progress > self.stall_s)
                or (viewer.caught_up and behind > self.lag_bytes)
                or viewer.cursor < self.store.start
            ):
                self._drop(viewer, counted=True)

    def _fill(self, viewer: _Viewer) -> None:
        # Replies are only inserted between whole ledger lines, never inside one.
        if viewer.replies:
            for reply in viewer.replies:
                viewer.outbuf += reply
            viewer.replies.clear()
        if viewer.cursor < self.store.end:
            chunk = self.store.read(viewer.cursor, CHUNK_BYTES)
            cut = chunk.rfind(b"\n") + 1
            if cut == 0 and len(chunk) < CHUNK_BYTES:
                return
            chunk = chunk[: cut or len(chunk)]
            viewer.outbuf += chunk
            viewer.cursor += len(chunk)

    def _send(self, viewer: _Viewer) -> None:
        while True:
            if not viewer.outbuf:
                self._fill(viewer)
                if not viewer.outbuf:
                    viewer.caught_up = True
                    viewer.last_progress = time.monotonic()
                    self._watch_writes(viewer, False)
                    return
            try:
                n = viewer.sock.send(viewer.outbuf)
            except (BlockingIOError, InterruptedError):
                self._watch_writes(viewer, True)
                return
            except OSError:
                self._drop(viewer, counted=False)
                return
            del viewer.outbuf[:n]
            viewer.last_progress = time.monotonic()

    def _watch_writes(self, viewer: _Viewer, on: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
        try:
            if self.selector.get_key(viewer.sock).events != events:
                self.selector.modify(viewer.sock, events)
        except (KeyError, ValueError):
            pass

    def _drop(self, viewer: _Viewer, *, counted: bool) -> None:
        fd = viewer.sock.fileno()
        if self._viewers.pop(fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(viewer.sock)
        viewer.sock.close()
        self.counters.viewers = len(self._viewers)
        if counted:
            self.counters.dropped_viewers += 1

    def close(self, grace_s: float = 1.0) -> None:
        """Stop listening, send what is left for up to ``grace_s``, then close every connection."""
        # A viewer that connected but was not accepted yet (in the backlog) would be reset by closing the listener:
        # it is served the run to its end with the others (a test saw ConnectionResetError once in eight runs).
        self._accept()
        # Listener first: a viewer that sees its connection end must not reconnect to a closing run.
        self.selector.unregister(self._listener)
        self._listener.close()
        if self._made is not None and _identity(self.path) == self._made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._tcp is not None:
            self.selector.unregister(self._tcp.sock)
            self._tcp.sock.close()
            for pending in list(self._unauthenticated.values()):
                self._forget(pending)
                pending.sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tcp.token_file)
        deadline = time.monotonic() + grace_s
        while self._viewers and time.monotonic() < deadline:
            self.pump()
            if all(not v.outbuf and v.cursor >= self.store.end for v in self._viewers.values()):
                break
            self.selector.select(0.01)
        for viewer in list(self._viewers.values()):
            self._drop(viewer, counted=False)
