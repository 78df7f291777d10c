"""``tuiwatch attach [TARGET]``: the live viewer. Never imports torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tuiwatch.viewer import DEFAULT_FPS


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attach",
        help="watch a live run in the terminal",
        description="Open the viewer on a live run. TARGET: a run name, a pid, or a socket path on this host "
        "(the name or run id of a torchrun job opens all of its ranks here; a pid, that rank alone); "
        "[user@]host:[name] for a run on another host, reached through your ssh; tcp://HOST:PORT with "
        "--token-file (or the token file alone) for a run started with Watch(tcp=...); without TARGET, the one "
        "live run here, or a picker when there are several.",
    )
    p.add_argument("target", nargs="?", help="run name, pid, socket path, [user@]host:[name], or tcp://HOST:PORT")
    p.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="the run's <name>.<pid>.tcp from its socket directory (mode 0600), for the TCP mode",
    )
    add_remote_options(p)
    add_fps_option(p)
    p.set_defaults(run=run)


def _fps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.5 <= value <= 60:
        raise argparse.ArgumentTypeError(f"--fps takes frames a second from 0.5 to 60, got {text!r}")
    return value


def add_fps_option(p: Any) -> None:
    p.add_argument(
        "--fps",
        type=_fps,
        default=DEFAULT_FPS,
        help="redraw at most this many times a second, and only when something changed (default 4; 10 is "
        "snappier and costs a run beside it about 2%%)",
    )


def add_remote_options(p: Any) -> None:
    p.add_argument(
        "--ssh",
        default=None,
        metavar="CMD",
        help="the ssh command for host: targets (default $TUIWATCH_SSH or ssh), e.g. 'ssh -p 2222'",
    )
    p.add_argument(
        "--remote-tuiwatch",
        default=None,
        metavar="CMD",
        help="tuiwatch on the remote host (default $TUIWATCH_REMOTE or tuiwatch), e.g. ~/venv/bin/tuiwatch",
    )


def run(args: argparse.Namespace) -> int:
    from tuiwatch.errors import TuiwatchError
    from tuiwatch.wire.discovery import (
        LiveJob,
        LiveRun,
        choose_remote_run,
        find_socket_by_name,
        parse_remote,
        resolve_target,
    )
    from tuiwatch.wire.tcp import check_tcp_target, tcp_target

    over_tcp = tcp_target(args.target, args.token_file)
    if over_tcp is not None:
        from tuiwatch.viewer.app import TuiwatchApp
        from tuiwatch.viewer.sources import TcpSource

        check_tcp_target(over_tcp)
        return TuiwatchApp(TcpSource(over_tcp), fps=args.fps).run_viewer()
    remote = parse_remote(args.target, args.ssh, args.remote_tuiwatch)
    if remote is not None:
        from tuiwatch.viewer.app import TuiwatchApp
        from tuiwatch.viewer.sources import CommandSource

        chosen = choose_remote_run(remote)
        return TuiwatchApp(
            CommandSource(remote.argv("relay", str(chosen.pid)), f"{remote.host}:{chosen.name}"), fps=args.fps
        ).run_viewer()
    found = resolve_target(args.target)
    if isinstance(found, list):
        from tuiwatch.viewer.screens.run_picker import pick_run

        choice = pick_run(found)
        if choice is None:
            return 0
        found = choice
    from tuiwatch.viewer.app import TuiwatchApp
    from tuiwatch.viewer.sources import RanksSource, SocketSource

    if isinstance(found, LiveJob):
        sockets = {r.rank or 0: Path(r.socket) for r in found.ranks}
        source = RanksSource(sockets, found.name, found.world_size, lambda n, r: find_socket_by_name(n, rank=r))
        return TuiwatchApp(source, fps=args.fps).run_viewer()
    assert isinstance(found, LiveRun)

    if not Path(found.socket).exists():
        raise TuiwatchError(f"the run {found.name} went away before the viewer started")
    return TuiwatchApp(SocketSource(Path(found.socket), found.name, find_socket_by_name), fps=args.fps).run_viewer()
