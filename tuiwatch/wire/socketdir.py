"""Where run sockets live, and the checks that keep that place private."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from tuiwatch.errors import UnsafeSocketDirError
from tuiwatch.ledger.litter import pid_alive
from tuiwatch.wire.protocol import connect

SOCKET_SUFFIX = ".sock"
TCP_FILE_SUFFIX = ".tcp"  # the token file of a run that also listens on TCP
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def socket_dir() -> Path:
    """``$TUIWATCH_DIR``, else ``$XDG_RUNTIME_DIR/tuiwatch``, else ``/tmp/tuiwatch-<uid>``."""
    # Absolute: the path is shown (ls, the run record) and must mean the same from any directory.
    if os.environ.get("TUIWATCH_DIR"):
        return Path(os.environ["TUIWATCH_DIR"]).absolute()
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]).absolute() / "tuiwatch"
    return Path(f"/tmp/tuiwatch-{os.getuid()}")


def check_private_dir(path: Path) -> Path:
    """``path``, or :class:`UnsafeSocketDirError` unless it is a real directory only we can use."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeSocketDirError(f"socket directory {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeSocketDirError(
            f"socket directory {path} is a symlink: remove it or set TUIWATCH_DIR to a private directory"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSocketDirError(f"socket directory {path} is not a directory: remove it or set TUIWATCH_DIR")
    if st.st_uid != os.getuid():
        raise UnsafeSocketDirError(
            f"socket directory {path} is owned by uid {st.st_uid}, not you (another user made it first): "
            "export TUIWATCH_DIR=$XDG_RUNTIME_DIR/tuiwatch, or any directory only you can write"
        )
    if st.st_mode & 0o077:
        raise UnsafeSocketDirError(
            f"socket directory {path} has mode {stat.S_IMODE(st.st_mode):04o}, other users could reach "
            f"the runs: run 'chmod 700 {path}'"
        )
    return path


def ensure_socket_dir(path: Path | None = None) -> Path:
    """Create the socket directory 0700 if missing, then check it is private."""
    path = path or socket_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafeSocketDirError(f"cannot create socket directory {path}: {exc.strerror}") from None
    check_private_dir(path)
    return path


def safe_name(name: str) -> str:
    """A run name usable in a file name: no separators, no dots at the start."""
    cleaned = _UNSAFE_NAME_CHARS.sub("-", name).strip(".-")
    return cleaned[:64] or "run"


def socket_path(directory: Path, name: str, pid: int) -> Path:
    return directory / f"{safe_name(name)}.{pid}{SOCKET_SUFFIX}"


def free_socket_path(directory: Path, name: str, pid: int) -> Path:
    """``<name>.<pid>.sock``, or ``<name>-2.<pid>.sock``, ``-3``… while another run of this process holds that name.

    Two Watches of one name open at once in one process (a script's default name, two models), or a sweep's next
    trial while the last one's thread is still closing: binding the same path would take it from the earlier run,
    which no viewer could reach any more. Called after :func:`remove_stale_sockets`, so what is left under the name
    is live. The TCP token file beside a socket counts too: it goes after the socket when a run closes.
    """
    path, n = socket_path(directory, name, pid), 1
    while os.path.lexists(path) or os.path.lexists(path.with_suffix(TCP_FILE_SUFFIX)):
        n += 1
        path = socket_path(directory, f"{safe_name(name)[:56]}-{n}", pid)  # the "-N" within safe_name's 64
    return path


@dataclass(frozen=True)
class SocketEntry:
    path: Path
    name: str
    pid: int


def parse_socket_name(path: Path) -> SocketEntry | None:
    """``<name>.<pid>.sock`` → its parts, or None for anything else in the directory."""
    if not path.name.endswith(SOCKET_SUFFIX):
        return None
    stem = path.name[: -len(SOCKET_SUFFIX)]
    name, _, pid = stem.rpartition(".")
    if not name or not pid.isdigit():
        return None
    return SocketEntry(path=path, name=name, pid=int(pid))


def list_sockets(directory: Path) -> list[SocketEntry]:
    try:
        names = sorted(directory.iterdir())
    except FileNotFoundError:
        return []
    return [e for e in (parse_socket_name(p) for p in names) if e is not None]


SocketId = tuple[str, int]  # a socket's path and inode: a socket bound again at the same path is another run's


def socket_id(path: Path | str) -> SocketId | None:
    try:
        return str(path), os.stat(path).st_ino
    except OSError:
        return None


def socket_ids(directory: Path) -> frozenset[SocketId]:
    """The sockets in ``directory`` now, each as its :data:`SocketId`."""
    ids = (socket_id(e.path) for e in list_sockets(directory))
    return frozenset(i for i in ids if i is not None)


def remove_stale_sockets(directory: Path) -> list[SocketEntry]:
    """Remove sockets whose process is gone or that nothing listens on; return the live ones."""
    live = []
    for entry in list_sockets(directory):
        stale = not pid_alive(entry.pid)
        if not stale:
            try:
                connect(entry.path, timeout=1.0).close()
            except (ConnectionRefusedError, FileNotFoundError):
                stale = True
            except OSError:
                pass  # busy or slow: leave it alone
        if stale:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        else:
            live.append(entry)
    # TCP token files (see tuiwatch.wire.tcp) of runs that died without closing.
    for path in directory.glob(f"*.*{TCP_FILE_SUFFIX}"):
        pid = path.name[: -len(TCP_FILE_SUFFIX)].rpartition(".")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(path)
    return live
