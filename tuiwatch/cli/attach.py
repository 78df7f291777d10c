"""``tuiwatch attach [TARGET]``: the live viewer. Never imports torch."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuiwatch.viewer import THEMES

if TYPE_CHECKING:
    from tuiwatch.viewer.sources import RanksSource
    from tuiwatch.wire.discovery import Remote


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
    p.add_argument(
        "target",
        nargs="*",
        help="run name, pid, socket path, [user@]host:[name], or tcp://HOST:PORT; several host:name, the hosts "
        "of one job",
    )
    p.add_argument("--hosts", default=None, metavar="H1,H2", help="the hosts of one job: attach --hosts gpu1,gpu2 NAME")
    p.add_argument("--ranks", default=None, metavar="SPEC", help="only these ranks of a job, e.g. 0,2,4-7")
    p.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="the run's <name>.<pid>.tcp from its socket directory (mode 0600), for the TCP mode",
    )
    add_remote_options(p)
    add_fps_option(p)
    add_compare_option(p)
    p.add_argument(
        "--no-bell",
        dest="bell",
        action="store_false",
        help="do not ring the terminal bell when a critical alert comes (tmux and most terminals make it a "
        "notification)",
    )
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
    """--theme and --fps, the viewer's look (both also in the config file, docs/viewer.md)."""
    p.add_argument(
        "--theme",
        choices=list(THEMES),
        default=None,
        help="colours: dark (default), light, ansi (the terminal's own 16 colours, for a poor terminal), or ascii "
        "(those, and only ASCII characters: no braille, no box drawing)",
    )
    p.add_argument(
        "--fps",
        type=_fps,
        default=None,
        help="redraw at most this many times a second, and only when something changed (default 4, or the "
        "config file's fps; 10 is snappier and costs a run beside it about 2%%)",
    )


def viewer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The viewer app's keyword arguments: the command line's flags, else the config file's settings."""
    from tuiwatch.cli.settings import WINDOWS, load_settings

    settings = load_settings()
    return {
        "fps": args.fps if args.fps is not None else settings.fps,
        "bell": getattr(args, "bell", True) and settings.bell,
        "theme": getattr(args, "theme", None) or settings.theme,
        "window": WINDOWS[settings.window],
        "smoothing": settings.smoothing,
        "baseline": baseline_of(getattr(args, "compare", None)),
    }


def add_compare_option(p: Any) -> None:
    p.add_argument(
        "--compare",
        default=None,
        metavar="B",
        help="draw another run (a ledger or run directory) beside this one in every chart, aligned by step, and "
        "say at which step the two part",
    )


def baseline_of(path: str | None) -> Any:
    """The run ``--compare`` names, read and folded once (a one-line error when it cannot be read)."""
    if path is None:
        return None
    from tuiwatch.viewer.baseline import Baseline
    from tuiwatch.viewer.sources import read_run

    return Baseline.of(read_run(path), label=path)


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
    from tuiwatch.wire.discovery import parse_ranks, parse_remote
    from tuiwatch.wire.tcp import check_tcp_target, tcp_target

    targets: list[str] = list(args.target)
    if args.hosts:
        if len(targets) != 1 or ":" in targets[0]:
            raise TuiwatchError("--hosts H1,H2 takes one run NAME (or run id): tuiwatch attach --hosts gpu1,gpu2 NAME")
        targets = [f"{host.strip()}:{targets[0]}" for host in args.hosts.split(",") if host.strip()]
    ranks = parse_ranks(args.ranks) if args.ranks else None
    if len(targets) > 1:
        remotes = [parse_remote(t, args.ssh, args.remote_tuiwatch) for t in targets]
        if any(r is None for r in remotes):
            raise TuiwatchError("several targets are the hosts of one job: give each as HOST:NAME")
        return _attach_job([r for r in remotes if r is not None], ranks, viewer_options(args))
    target = targets[0] if targets else None
    over_tcp = tcp_target(target, args.token_file)
    if over_tcp is not None:
        from tuiwatch.viewer.app import TuiwatchApp
        from tuiwatch.viewer.sources import TcpSource

        check_tcp_target(over_tcp)
        return TuiwatchApp(TcpSource(over_tcp), **viewer_options(args)).run_viewer()
    remote = parse_remote(target, args.ssh, args.remote_tuiwatch)
    if remote is not None:
        return _attach_remote(remote, ranks, viewer_options(args))
    return _attach_local(target, ranks, viewer_options(args))


def _attach_local(target: str | None, ranks: set[int] | None, viewer: dict[str, Any]) -> int:
    from tuiwatch.errors import TuiwatchError
    from tuiwatch.viewer.app import TuiwatchApp
    from tuiwatch.viewer.sources import RanksSource, SocketSource
    from tuiwatch.wire.discovery import LiveJob, LiveRun, find_rank_socket, find_socket_by_name, resolve_target

    found = resolve_target(target)
    if isinstance(found, list):
        from tuiwatch.viewer.screens.run_picker import pick_run

        choice = pick_run(found)
        if choice is None:
            return 0
        found = choice
    if isinstance(found, LiveJob):
        sockets = {r.rank or 0: Path(r.socket) for r in found.ranks if ranks is None or r.rank in ranks}
        if not sockets:
            raise TuiwatchError(f"--ranks: none of those ranks of {found.name} is on this host")
        source = RanksSource.on_this_host(found.name, found.world_size, sockets, find_rank_socket)
        return TuiwatchApp(source, **viewer).run_viewer()
    assert isinstance(found, LiveRun)
    if not Path(found.socket).exists():
        raise TuiwatchError(f"the run {found.name} went away before the viewer started")
    return TuiwatchApp(SocketSource(Path(found.socket), found.name, find_socket_by_name), **viewer).run_viewer()


def _attach_remote(remote: Remote, ranks: set[int] | None, viewer: dict[str, Any]) -> int:
    """One host: a single run through ``relay PID``; a job's ranks there through one ``relay RUN_ID``."""
    from tuiwatch.viewer.app import TuiwatchApp
    from tuiwatch.viewer.sources import CommandSource
    from tuiwatch.wire.discovery import choose_remote_run

    chosen = choose_remote_run(remote)
    if chosen.world_size and chosen.world_size > 1 and chosen.rank is not None and remote.name != str(chosen.pid):
        return _attach_job([remote if remote.name else replace(remote, name=chosen.run_id)], ranks, viewer)
    # By its socket, not its pid: two Watches of one process are two runs of one pid.
    source = CommandSource(remote.argv("relay", chosen.socket), f"{remote.host}:{chosen.name}")
    return TuiwatchApp(source, **viewer).run_viewer()


def _attach_job(remotes: list[Remote], ranks: set[int] | None, viewer: dict[str, Any]) -> int:
    from tuiwatch.viewer.app import TuiwatchApp

    return TuiwatchApp(job_source(remotes, ranks), **viewer).run_viewer()


def job_source(remotes: list[Remote], ranks: set[int] | None = None) -> RanksSource:
    """The ranks of one job on several hosts (or one): one ssh per host, each carrying that host's ranks."""
    from tuiwatch.errors import TuiwatchError
    from tuiwatch.viewer.sources import RanksSource, RelaySource
    from tuiwatch.wire.discovery import find_remote_job

    found = find_remote_job(remotes)
    relays = []
    for remote, job in found:
        here = [r.rank or 0 for r in job.ranks if ranks is None or r.rank in ranks]
        if here:
            relays.append(RelaySource(remote.argv("relay", job.run_id), remote.host, here))
    if not relays:
        raise TuiwatchError("--ranks: none of those ranks is on the hosts given")
    name, world_size = found[0][1].name, max(job.world_size for _, job in found)
    return RanksSource(name, world_size, relays=relays)
