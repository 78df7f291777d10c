"""``tuiwatch relay TARGET``: the wire protocol of a local run on stdin/stdout (what ssh attach runs remotely)."""

from __future__ import annotations

import argparse
import os
import selectors
import sys
from typing import Any

from tuiwatch.errors import TuiwatchError
from tuiwatch.wire.job_relay import write_all


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "relay",
        help="speak a local run's wire protocol on stdin/stdout (for ssh)",
        description="Connect to a live run of this host and copy its stream to stdout and commands from stdin "
        "to it; for a job of several ranks here, every rank's stream, labelled (docs/wire.md). "
        "`tuiwatch attach host:name` runs this on the other side of ssh.",
    )
    p.add_argument("target", nargs="?", help="run name, pid or socket path (none: the only live run)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tuiwatch.wire.discovery import LiveJob, LiveRun, resolve_target
    from tuiwatch.wire.protocol import connect

    found = resolve_target(args.target)
    if isinstance(found, list):
        names = ", ".join(f"{r.name} ({_pids(r)})" for r in found)
        raise TuiwatchError(f"several live runs match: {names}; name one")
    if isinstance(found, LiveJob):
        from tuiwatch.wire.job_relay import relay_job

        return relay_job(found, sys.stdin.fileno(), sys.stdout.fileno())
    assert isinstance(found, LiveRun)
    try:
        sock = connect(found.socket, timeout=5.0)
    except OSError as exc:
        raise TuiwatchError(f"cannot connect to the run {found.name}: {exc.strerror or exc}") from None
    sock.setblocking(True)
    sock.settimeout(None)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "run")
    selector.register(stdin, selectors.EVENT_READ, "viewer")
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "run":
                    data = sock.recv(1 << 16)
                    if not data:
                        return 0  # the run ended the stream
                    write_all(stdout, data)
                else:
                    data = os.read(stdin, 1 << 16)
                    if not data:
                        return 0  # the viewer went away
                    sock.sendall(data)
    except BrokenPipeError:
        return 0  # the viewer closed its end
    finally:
        selector.close()
        sock.close()


def _pids(found: Any) -> str:
    ranks = getattr(found, "ranks", None)
    if ranks is None:
        return f"pid {found.pid}"
    return "pids " + ", ".join(f"{r.pid} (rank {r.rank})" for r in ranks)
