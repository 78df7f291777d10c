"""Live runs on this host, as ``tuiwatch ls`` and ``tuiwatch attach`` find them. Pure: no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuiwatch.ledger.reader import tail_records
from tuiwatch.ledger.socketdir import check_private_dir, remove_stale_sockets, socket_dir
from tuiwatch.ledger.wire import connect, iter_records


@dataclass
class LiveRun:
    name: str
    pid: int
    socket: str
    step: int | None
    status: str
    run_id: str | None
    ledger: str | None


def _first_record(path: Path, timeout: float) -> dict[str, Any] | None:
    try:
        sock = connect(path, timeout=timeout)
    except OSError:
        return None
    try:
        return next(iter_records(sock), None)
    except OSError:  # a timeout included
        return None
    finally:
        sock.close()


def _progress(ledger: str | None) -> tuple[int | None, str]:
    if not ledger:
        return None, "live"
    try:
        records = tail_records(ledger)
    except Exception:
        return None, "live"
    step, status = None, "live"
    for record in records:
        kind = record.get("kind")
        if kind == "step":
            step = record.get("step")
        elif kind == "publisher" and record.get("status") == "degraded":
            status = "degraded"
        elif kind == "end":
            status = "stopped" if record.get("reason") == "stopped" else "finished"
    return step, status


def list_live_runs(directory: Path | None = None, timeout: float = 1.0) -> list[LiveRun]:
    """Runs listening in the socket directory; stale sockets are removed on the way."""
    directory = directory or socket_dir()
    if not directory.exists():
        return []
    check_private_dir(directory)
    runs = []
    for entry in remove_stale_sockets(directory):
        run = _first_record(entry.path, timeout)
        if run is None or run.get("kind") != "run":
            continue
        ledger = run.get("run_dir")
        ledger = str(Path(ledger) / "ledger.jsonl") if ledger else None
        step, status = _progress(ledger)
        runs.append(
            LiveRun(
                name=str(run.get("name", entry.name)),
                pid=entry.pid,
                socket=str(entry.path),
                step=step,
                status=status,
                run_id=run.get("run_id"),
                ledger=ledger,
            )
        )
    return runs


def as_dicts(runs: list[LiveRun]) -> list[dict[str, Any]]:
    return [asdict(r) for r in runs]


def resolve_target(target: str | None, directory: Path | None = None) -> LiveRun | list[LiveRun]:
    """The live run that ``target`` names (name, pid or socket path), or every candidate when ambiguous.

    Raises TuiwatchError with a one-line hint when nothing matches.
    """
    from tuiwatch.errors import TuiwatchError

    if target and ("/" in target or target.endswith(".sock")):
        path = Path(target)
        if not path.exists():
            raise TuiwatchError(f"no socket at {target}: is the run still going? (tuiwatch ls lists live runs)")
        run = _first_record(path, 2.0)
        if run is None:
            raise TuiwatchError(f"{target} does not answer as a tuiwatch run")
        return LiveRun(str(run.get("name", "?")), int(run.get("pid", 0)), str(path), None, "live",
                       run.get("run_id"), None)  # fmt: skip
    runs = list_live_runs(directory)
    if not runs:
        raise TuiwatchError("no live runs on this host: start one (tuiwatch demo --no-viewer) or replay a ledger")
    if target is None:
        return runs[0] if len(runs) == 1 else runs
    matches = [r for r in runs if r.name == target or str(r.pid) == target]
    if not matches:
        names = ", ".join(f"{r.name} (pid {r.pid})" for r in runs)
        raise TuiwatchError(f"no live run named {target!r}; live runs: {names}")
    return matches[0] if len(matches) == 1 else matches


def find_socket_by_name(name: str, directory: Path | None = None) -> Path | None:
    """The socket of the newest live run called ``name`` (for reconnecting after a restart)."""
    try:
        runs = [r for r in list_live_runs(directory, timeout=0.5) if r.name == name]
    except Exception:
        return None
    return Path(max(runs, key=lambda r: r.pid).socket) if runs else None
