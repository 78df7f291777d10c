"""The optional TCP transport, for hosts where SSH is impossible.

Off unless the run asks for it (``Watch(..., tcp=True)`` or an address). It
listens on loopback unless given another address explicitly. The run writes
a random token to ``<socket dir>/<name>.<pid>.tcp`` (mode 0600, created
exclusively, as JSON ``{"address": "HOST:PORT", "token": "..."}``); a
connection must send ``{"token": "..."}`` and a newline as its first line,
within :data:`AUTH_TIMEOUT_S`, before the server sends it one byte. After
that the protocol is the Unix socket's (:mod:`tuiwatch.wire.protocol`). A
first line that does not start like one (HTTP, TLS, anything else), a wrong token, or no line in time closes
the connection unanswered and counts as a refused peer.

The token is a password in a file: whoever can read that file can watch and
command the run. Nothing here encrypts the stream; on a network you do not
trust, use SSH.
"""

from __future__ import annotations

import hmac
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import DecodeError, decode, encode
from tuiwatch.wire.socketdir import TCP_FILE_SUFFIX

LOOPBACK = "127.0.0.1"
AUTH_TIMEOUT_S = 5.0
MAX_AUTH_BYTES = 512
MAX_PENDING_AUTH = 16


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


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def token_line(token: str) -> bytes:
    return encode({"token": token})


def could_be_token_line(data: bytes) -> bool:
    """False as soon as the first bytes cannot start ``{"token": ...}``.

    An HTTP request (``GET /``, ``POST``, an HTTP/2 preface), a TLS hello or
    any other protocol starts with something else, so it is dropped on its
    first bytes, unanswered.
    """
    start = data.lstrip(b" \t\r\n")[:1]
    return start in (b"", b"{")


def token_matches(line: bytes, token: str) -> bool:
    """Whether ``line`` is ``{"token": T}`` with T equal to ``token`` (compared in constant time)."""
    try:
        obj = decode(line)
    except DecodeError:
        return False
    given = obj.get("token")
    return isinstance(given, str) and hmac.compare_digest(given.encode(), token.encode())


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
        data = path.read_bytes()
    except OSError as exc:
        raise TuiwatchError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
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


def connect_tcp(target: TcpTarget, timeout: float = 5.0) -> socket.socket:
    """A connection to the run at ``target`` that has sent its token line; raises OSError."""
    sock = socket.create_connection((target.host, target.port), timeout=timeout)
    try:
        sock.sendall(token_line(target.token))
    except OSError:
        sock.close()
        raise
    return sock


def check_tcp_target(target: TcpTarget, timeout: float = 5.0) -> None:
    """A one-line error unless the run at ``target`` answers its token with the first bytes of its ledger."""
    where = format_address(target.host, target.port)
    try:
        sock = connect_tcp(target, timeout)
    except OSError as exc:
        raise TuiwatchError(
            f"cannot reach a run at {where} ({exc.strerror or exc}): is it running with Watch(tcp=...)?"
        ) from None
    try:
        first = sock.recv(1)
    except OSError as exc:
        raise TuiwatchError(f"the run at {where} did not answer ({exc.strerror or exc})") from None
    finally:
        sock.close()
    if not first:
        raise TuiwatchError(
            f"the run at {where} refused the token: copy the token file again (each run writes a new one)"
        )
