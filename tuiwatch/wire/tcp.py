"""The optional TCP transport, for hosts where SSH is impossible.

Off unless the run asks for it (``Watch(..., tcp=True)`` or an address). It
listens on loopback unless given another address explicitly. The run writes
a random token to ``<socket dir>/<name>.<pid>.tcp`` (mode 0600, created
exclusively, as JSON ``{"address": "HOST:PORT", "token": "..."}``).

The token itself never crosses the connection: each side proves it holds it
by an HMAC-SHA256 over two fresh nonces, the run first, so a viewer that
reconnects to whatever now holds the port (the run ended, someone else bound
it) learns that it is not the run before it believes or sends anything::

    viewer -> {"hello": "tuiwatch-tcp-1", "nonce": NV}
    run    -> {"nonce": NR, "proof": HMAC(token, "run" NV NR)}
    viewer -> {"proof": HMAC(token, "viewer" NV NR)}      (only if the run's proof holds)
    run    -> {"ok": true}, then the ledger: the Unix socket's protocol from here
              (or {"refused": "..."} and closed, if the viewer's proof does not hold)

A first line that does not start like a hello (HTTP, TLS, anything else), a
malformed line, or a handshake not done within :data:`AUTH_TIMEOUT_S` closes
the connection unanswered and counts as a refused peer. At most
:data:`MAX_PENDING_AUTH` connections wait at once; a new one evicts the
oldest that has got least far, so silent connections cannot lock the token's
holder out.

Nothing here encrypts the stream; on a network you do not trust, use SSH.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import DecodeError, decode, encode
from tuiwatch.ledger.reader import read_small
from tuiwatch.wire.socketdir import TCP_FILE_SUFFIX

LOOPBACK = "127.0.0.1"
HELLO = "tuiwatch-tcp-1"
NONCE_BYTES = 16
AUTH_TIMEOUT_S = 2.0  # for the whole handshake: two lines each way, on any network a viewer should use
MAX_AUTH_BYTES = 512
MAX_PENDING_AUTH = 16
CHECK_ATTEMPTS = 3  # a handshake cut by a flood's eviction is tried again


@dataclass(frozen=True)
class TcpTarget:
    host: str
    port: int
    token: str


def parse_address(text: str, default_host: str = LOOPBACK) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` as ``(host, port)``; a one-line error otherwise."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = default_host, text.strip()
    host = host.strip("[]") or default_host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise TuiwatchError(f"bad TCP address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7777")
    return host, int(port)


def tcp_option(value: bool | str) -> tuple[str, int] | None:
    """``Watch(tcp=...)``: False (off), True (loopback, any free port) or ``"HOST:PORT"``."""
    if value is False:
        return None
    if value is True:
        return LOOPBACK, 0
    if isinstance(value, str):
        return parse_address(value)
    raise TypeError(f"tcp must be False, True (loopback, any port) or 'HOST:PORT', got {type(value).__name__}")


def exposure_warning(host: str, address: str) -> str | None:
    """One line when the listener is reachable from beyond this host (the stream is not encrypted)."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: whatever it resolves to may be any interface
        loopback = host == "localhost"
    if loopback:
        return None
    return (
        f"TCP listener at {address} is reachable from other hosts: the stream is not encrypted "
        "(only on a network you trust; otherwise attach over ssh)"
    )


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def proof(token: str, role: str, viewer_nonce: str, run_nonce: str) -> str:
    """What ``role`` ("run" or "viewer") sends to show it holds ``token``; the roles never share a proof."""
    message = f"tuiwatch-tcp-1\n{role}\n{viewer_nonce}\n{run_nonce}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def proof_holds(given: object, token: str, role: str, viewer_nonce: str, run_nonce: str) -> bool:
    """Whether ``given`` is ``role``'s proof (compared in constant time)."""
    return isinstance(given, str) and hmac.compare_digest(
        given.encode(), proof(token, role, viewer_nonce, run_nonce).encode()
    )


def hello_line(viewer_nonce: str) -> bytes:
    return encode({"hello": HELLO, "nonce": viewer_nonce})


def could_be_hello(data: bytes) -> bool:
    """False as soon as the first bytes cannot start a JSON line.

    An HTTP request (``GET /``, ``POST``, an HTTP/2 preface), a TLS hello or
    any other protocol starts with something else, so it is dropped on its
    first bytes, unanswered.
    """
    start = data.lstrip(b" \t\r\n")[:1]
    return start in (b"", b"{")


def handshake_object(line: bytes) -> dict[str, object]:
    """A handshake line as an object; empty when it is not one."""
    try:
        return decode(line)
    except DecodeError:
        return {}


def field_of(line: bytes, key: str, expected: dict[str, object] | None = None) -> str | None:
    """``line``'s string ``key`` when the line is a JSON object with ``expected`` in it; None otherwise."""
    obj = handshake_object(line)
    if any(obj.get(k) != v for k, v in (expected or {}).items()):
        return None
    value = obj.get(key)
    return value if isinstance(value, str) and 0 < len(value) <= 128 else None


def hello_nonce(line: bytes) -> str | None:
    """The viewer's nonce, if ``line`` is a hello."""
    return field_of(line, "nonce", {"hello": HELLO})


def write_token_file(path: Path, address: str, token: str) -> None:
    """Create ``path`` 0600 with the address and the token; never over an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, encode({"address": address, "token": token}))
    finally:
        os.close(fd)


def read_token_file(path: Path, host: str | None = None) -> TcpTarget:
    """The address and token a run wrote, as a target; ``host`` replaces the file's (e.g. 0.0.0.0).

    Refused when others can read the file, as ssh refuses a readable key.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise TuiwatchError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    data = read_small(path, limit=4096)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TuiwatchError(f"the token file {path} can be read by others (mode {mode & 0o777:o}): chmod 600 it")
    try:
        obj = decode(data.strip())
        file_host, port = parse_address(str(obj["address"]))
        token = obj["token"]
    except (DecodeError, KeyError, TuiwatchError):
        raise TuiwatchError(f"{path} is not a tuiwatch token file (expected address and token)") from None
    if not isinstance(token, str) or not token:
        raise TuiwatchError(f"{path} is not a tuiwatch token file (expected address and token)")
    return TcpTarget(host or file_host, port, token)


def tcp_target(target: str | None, token_file: str | None) -> TcpTarget | None:
    """What ``tuiwatch attach`` was given, if it is a TCP target; None for every other kind.

    ``tcp://HOST:PORT --token-file F``, an existing token file itself
    (``….tcp``), or ``--token-file F`` alone (the address written in the file).
    """
    if target is not None and target.startswith("tcp://"):
        if token_file is None:
            raise TuiwatchError("a tcp:// target needs --token-file FILE: the run's <name>.<pid>.tcp, copied over")
        host, port = parse_address(target[len("tcp://") :])
        return TcpTarget(host, port, read_token_file(Path(token_file)).token)
    if target is not None and target.endswith(TCP_FILE_SUFFIX) and token_file is None and Path(target).is_file():
        return read_token_file(Path(target))
    if token_file is not None:
        if target is not None:
            raise TuiwatchError("--token-file goes with a tcp://HOST:PORT target, or alone")
        return read_token_file(Path(token_file))
    return None


class HandshakeError(TuiwatchError):
    """The handshake failed; the message says which side and what to do."""


class HandshakeInterrupted(HandshakeError):
    """The run closed the connection mid-handshake without refusing it: it evicted it (a flood), so retry."""


def _evicted(where: str) -> HandshakeInterrupted:
    return HandshakeInterrupted(
        f"the run at {where} closed the connection during the handshake: too many connections "
        "were waiting to authenticate (another user flooding the port?); try again"
    )


def _send(sock: socket.socket, data: bytes, where: str) -> None:
    try:
        sock.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        raise _evicted(where) from None


def _line(sock: socket.socket, buffer: bytearray, where: str) -> bytes:
    while b"\n" not in buffer:
        try:
            chunk = sock.recv(MAX_AUTH_BYTES)  # a timeout is an OSError: nothing answers, as for a refused connect
        except ConnectionResetError:
            # Evicted before the run read our hello: a socket closed with unread bytes is reset, not ended (a
            # loaded host, where the run's first read came before the hello arrived).
            raise _evicted(where) from None
        if not chunk:
            raise _evicted(where)
        buffer += chunk
        if len(buffer) > MAX_AUTH_BYTES and b"\n" not in buffer:
            raise HandshakeError(f"what listens at {where} is not a tuiwatch run (a line too long)")
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def handshake(sock: socket.socket, target: TcpTarget) -> bytes:
    """Prove the run holds the token, then prove the viewer does; the bytes read past the handshake.

    Nothing but a fresh nonce is sent before the run's proof holds.
    """
    where = format_address(target.host, target.port)
    viewer_nonce = new_nonce()
    _send(sock, hello_line(viewer_nonce), where)
    buffer = bytearray()
    challenge = _line(sock, buffer, where)
    run_nonce = field_of(challenge, "nonce")
    run_proof = field_of(challenge, "proof")
    if run_nonce is None or not proof_holds(run_proof, target.token, "run", viewer_nonce, run_nonce):
        raise HandshakeError(
            f"what listens at {where} did not prove it holds this token: the token file is from another run "
            "(each run writes a new one: copy it again), or the run ended and something else has its port"
        )
    _send(sock, encode({"proof": proof(target.token, "viewer", viewer_nonce, run_nonce)}), where)
    answer = _line(sock, buffer, where)
    if field_of(answer, "refused") is not None:
        raise HandshakeError(
            f"the run at {where} refused the token: copy the token file again (each run writes a new one)"
        )
    if handshake_object(answer).get("ok") is not True:
        raise HandshakeError(f"what listens at {where} is not a tuiwatch run (an unexpected answer)")
    return bytes(buffer)


def connect_tcp(target: TcpTarget, timeout: float = 5.0) -> tuple[socket.socket, bytes]:
    """A connection to the run at ``target`` that has done the handshake, and the first stream bytes.

    Raises OSError when nothing answers, :class:`HandshakeError` when the handshake fails.
    """
    sock = socket.create_connection((target.host, target.port), timeout=timeout)
    try:
        first = handshake(sock, target)
    except (OSError, HandshakeError):
        sock.close()
        raise
    return sock, first


def check_tcp_target(target: TcpTarget, timeout: float = 5.0) -> None:
    """A one-line error unless the run at ``target`` completes the handshake."""
    where = format_address(target.host, target.port)
    for attempt in range(CHECK_ATTEMPTS):
        try:
            sock, _ = connect_tcp(target, timeout)
        except OSError as exc:
            raise TuiwatchError(
                f"cannot reach a run at {where} ({exc.strerror or exc}): is it running with Watch(tcp=...)?"
            ) from None
        except HandshakeInterrupted:
            if attempt == CHECK_ATTEMPTS - 1:
                raise
            continue
        sock.close()
        return
