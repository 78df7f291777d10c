"""A Unix socket's address that fits: a path longer than ``sun_path`` is reached through its directory's descriptor.

A Unix socket address holds at most 107 bytes of path on Linux. A run's
socket is ``<socket dir>/<name up to 64>.<pid>.sock``, so a socket directory
of more than ~30 characters (``TUIWATCH_DIR`` under a long home or scratch
path) left a run with a long name unreachable: "cannot listen: AF_UNIX path
too long", training on but no viewer. Where the path is too long, the socket
is bound and connected at ``/proc/self/fd/<fd>/<name>``, ``<fd>`` its
directory held open for the call: the same directory and the same file, its
0700 and 0600 as ever. Where that is not possible (no ``/proc``, a name that is
itself too long) the path is used as it is, and the caller gets the error it
always got.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

SUN_PATH_MAX = 107  # bytes of path in a sockaddr_un on Linux (108 with its terminating NUL)


@contextlib.contextmanager
def unix_address(path: str | Path) -> Iterator[str]:
    """``path`` as an address to bind or connect to, valid inside the ``with`` block."""
    text = str(path)
    if len(os.fsencode(text)) <= SUN_PATH_MAX or not os.path.isdir("/proc/self/fd"):
        yield text
        return
    directory, name = os.path.split(text)
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        fd = -1
    if fd < 0:
        yield text  # the bind or connect says what is wrong with the directory
        return
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        yield short if len(os.fsencode(short)) <= SUN_PATH_MAX else text
    finally:
        os.close(fd)
