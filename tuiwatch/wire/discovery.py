"""Finding live runs: on this host through the socket directory, on another through the user's ssh.

``tuiwatch ls`` and ``tuiwatch attach`` find runs here. A remote host is
asked with ``ssh -T host tuiwatch ls --json`` and reached with ``ssh -T host
tuiwatch relay NAME``: nothing listens on the network, ssh carries the wire
protocol over its own channel, with the user's keys, ``~/.ssh/config`` and
jump hosts. No torch, no Textual.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections import Counter
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.fields import integer
from tuiwatch.ledger.reader import tail_records
from tuiwatch.ledger.records import Record
from tuiwatch.wire.protocol import connect, iter_records
from tuiwatch.wire.socketdir import SocketId, check_private_dir, remove_stale_sockets, socket_dir, socket_id


@dataclass
class LiveRun:
    name: str
    pid: int
    socket: str
    step: int | None
    status: str
    run_id: str | None
    ledger: str | None
    rank: int | None = None  # of a job of several processes (torchrun); None for a run of one
    world_size: int | None = None


@dataclass
class LiveJob:
    """The live ranks of one job (one ``run_id``, ``world_size`` above 1) on one host: one run to the user."""

    name: str
    run_id: str
    world_size: int
    ranks: list[LiveRun]  # by rank; those that listen here (a job on several hosts has the others elsewhere)

    @property
    def step(self) -> int | None:
        """The slowest rank's last step: how far the job as a whole has gone."""
        steps = [r.step for r in self.ranks if r.step is not None]
        return min(steps) if steps else None

    @property
    def status(self) -> str:
        statuses = {r.status for r in self.ranks}
        return statuses.pop() if len(statuses) == 1 else "mixed: " + ", ".join(sorted(statuses))


def group_jobs(runs: list[LiveRun]) -> list[LiveRun | LiveJob]:
    """The runs as the user thinks of them: the ranks of one job as one :class:`LiveJob`, in first-seen order.

    Ranks are grouped by ``run_id`` (and name: two jobs given the same ``run_id`` by hand stay apart); a
    rank listed twice (a restarted rank beside its stale socket) counts once, the newest pid.
    """
    grouped: list[LiveRun | LiveJob] = []
    jobs: dict[tuple[str, str], LiveJob] = {}
    for run in runs:
        if run.run_id is None or run.rank is None or not run.world_size or run.world_size < 2:
            grouped.append(run)
            continue
        key = (run.name, run.run_id)
        job = jobs.get(key)
        if job is None:
            job = jobs[key] = LiveJob(run.name, run.run_id, run.world_size, [])
            grouped.append(job)
        same = next((r for r in job.ranks if r.rank == run.rank), None)
        if same is not None and same.pid > run.pid:
            continue
        job.ranks = sorted([r for r in job.ranks if r.rank != run.rank] + [run], key=lambda r: r.rank or 0)
    return grouped


def _first_record(path: Path, timeout: float) -> Record | None:
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
                rank=integer(run.get("rank")),
                world_size=integer(run.get("world_size")),
            )
        )
    return runs


def as_dicts(runs: list[LiveRun]) -> list[dict[str, Any]]:
    return [asdict(r) for r in runs]


def resolve_target(target: str | None, directory: Path | None = None) -> LiveRun | LiveJob | list[LiveRun | LiveJob]:
    """The live run or job that ``target`` names (name, pid, run id or socket path), or every candidate when
    ambiguous. A name or run id that names the ranks of one job names the job; a pid names that rank alone.

    Raises TuiwatchError with a one-line hint when nothing matches.
    """
    if target and ("/" in target or target.endswith(".sock")):
        path = Path(target)
        if not path.exists():
            raise TuiwatchError(f"no socket at {target}: is the run still going? (tuiwatch ls lists live runs)")
        run = _first_record(path, 2.0)
        if run is None:
            raise TuiwatchError(f"{target} does not answer as a tuiwatch run")
        return LiveRun(
            str(run.get("name", "?")), int(run.get("pid", 0)), str(path), None, "live", run.get("run_id"), None
        )
    runs = list_live_runs(directory)
    if not runs:
        raise TuiwatchError("no live runs on this host: start one (tuiwatch demo --no-viewer) or replay a ledger")
    grouped = group_jobs(runs)
    if target is None:
        return grouped[0] if len(grouped) == 1 else grouped
    matches: list[LiveRun | LiveJob] = [r for r in runs if str(r.pid) == target]
    matches = matches or [g for g in grouped if target in (g.name, g.run_id)]
    if not matches:
        names = ", ".join(f"{r.name} (pid {r.pid})" for r in runs)
        raise TuiwatchError(f"no live run named {target!r}; live runs: {names}")
    return matches[0] if len(matches) == 1 else matches


def find_socket_by_name(
    name: str, skip: Collection[SocketId] = (), directory: Path | None = None, rank: int | None = None
) -> Path | None:
    """The socket of the newest live run called ``name`` (of that ``rank``, for a job's rank), for reconnecting
    after a restart; none of the sockets in ``skip`` (the runs that were already beside the one that ended)."""
    try:
        live = list_live_runs(directory, timeout=0.5)
    except Exception:
        return None
    runs = [r for r in live if r.name == name and rank in (None, r.rank) and socket_id(r.socket) not in skip]
    return Path(max(runs, key=lambda r: r.pid).socket) if runs else None


def find_rank_socket(name: str, rank: int, skip: Collection[SocketId] = ()) -> Path | None:
    """The socket of the newest live rank ``rank`` of a job called ``name``: a restarted rank, found again."""
    return find_socket_by_name(name, skip, rank=rank)


# --- another host, through ssh -------------------------------------------------------

DEFAULT_SSH = "ssh"
DEFAULT_REMOTE = "tuiwatch"
LIST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Remote:
    host: str  # [user@]host, as ssh takes it
    name: str | None  # the run; None: the only one, or ask
    ssh: str = DEFAULT_SSH  # the ssh command, split like a shell would: "ssh -p 2222 -i key"
    tuiwatch: str = DEFAULT_REMOTE  # the remote command: "~/venv/bin/tuiwatch", "python -m tuiwatch"

    def argv(self, *args: str) -> list[str]:
        # ssh joins the remote words with spaces for the remote shell: quote them as one string.
        # "--": whatever the host is, ssh reads it as a host, never as an option (-oProxyCommand=...).
        return [*shlex.split(self.ssh), "-T", "--", self.host, shlex.join([*shlex.split(self.tuiwatch), *args])]


def parse_remote(target: str | None, ssh: str | None = None, tuiwatch: str | None = None) -> Remote | None:
    """``[user@]host:[name]`` as a :class:`Remote`; None for a local target (name, pid, socket path)."""
    if not target or ":" not in target:
        return None
    host, _, name = target.partition(":")
    if host.startswith("-"):
        raise TuiwatchError(f"{host!r} is not a host: a host name cannot start with '-' (an ssh option?)")
    if not host or "/" in host:
        return None  # a path with a colon in it
    return Remote(
        host,
        name or None,
        ssh or os.environ.get("TUIWATCH_SSH") or DEFAULT_SSH,
        tuiwatch or os.environ.get("TUIWATCH_REMOTE") or DEFAULT_REMOTE,
    )


def list_remote_runs(remote: Remote) -> list[LiveRun]:
    """``tuiwatch ls --json`` on the remote host; a one-line TuiwatchError saying what failed."""
    argv = remote.argv("ls", "--json")
    try:
        done = subprocess.run(argv, capture_output=True, timeout=LIST_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise TuiwatchError(f"cannot run {argv[0]!r}: install OpenSSH or give --ssh") from None
    except subprocess.TimeoutExpired:
        raise TuiwatchError(f"ssh to {remote.host} did not answer in {LIST_TIMEOUT_S:.0f} s") from None
    err = done.stderr.decode(errors="replace").strip().splitlines()
    last = err[-1] if err else f"exit code {done.returncode}"
    if done.returncode == 255:
        raise TuiwatchError(f"ssh to {remote.host} failed: {last}")
    if done.returncode == 127 or "command not found" in last or "No module named" in last:
        raise TuiwatchError(
            f"tuiwatch is not installed on {remote.host} (ran: {remote.tuiwatch}): "
            "install it there, or give --remote-tuiwatch PATH"
        )
    if done.returncode != 0:
        raise TuiwatchError(f"tuiwatch ls on {remote.host} failed: {last}")
    try:
        rows = orjson.loads(done.stdout)
        return [
            LiveRun(
                str(r["name"]),
                int(r["pid"]),
                str(r["socket"]),
                r.get("step"),
                str(r.get("status", "?")),
                r.get("run_id"),
                r.get("ledger"),
                integer(r.get("rank")),
                integer(r.get("world_size")),
            )
            for r in rows
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise TuiwatchError(f"tuiwatch ls on {remote.host} did not answer with a run list") from None


def choose_remote_run(remote: Remote) -> LiveRun:
    """The run ``remote`` names, checked against the host's live runs (one ssh round trip); a job's first rank for
    a job. Where it names none or several, a one-line TuiwatchError lists a target for each run that names it alone.
    """
    runs = list_remote_runs(remote)
    if not runs:
        raise TuiwatchError(f"no live runs on {remote.host}")
    if remote.name is None:
        grouped = group_jobs(runs)
        if len(grouped) > 1:
            raise TuiwatchError(f"{len(grouped)} live runs on {remote.host}: attach {_each(remote.host, grouped)}")
        return grouped[0].ranks[0] if isinstance(grouped[0], LiveJob) else grouped[0]
    matches = [r for r in runs if remote.name in (r.name, str(r.pid), r.run_id, r.socket)]
    if not matches:
        names = ", ".join(f"{r.name} (pid {r.pid})" for r in runs)
        raise TuiwatchError(f"no live run named {remote.name!r} on {remote.host}; live runs: {names}")
    grouped = group_jobs(matches)  # (the ranks of one job are one run)
    if len(grouped) > 1:
        raise TuiwatchError(
            f"{len(grouped)} live runs named {remote.name!r} on {remote.host}: attach {_each(remote.host, grouped)}"
        )
    return matches[0]


def _each(host: str, grouped: list[LiveRun | LiveJob]) -> str:
    """``HOST:NAME or HOST:PID or …``, each naming one of ``grouped`` alone: its name where no other run has it,
    else a job's run id or a run's pid, else its socket (two Watches of one process share name and pid)."""
    names = Counter(g.name for g in grouped)
    pids = Counter(g.pid for g in grouped if isinstance(g, LiveRun))
    targets = []
    for g in grouped:
        if names[g.name] == 1:
            targets.append(g.name)
        elif isinstance(g, LiveJob):
            targets.append(g.run_id)
        else:
            targets.append(str(g.pid) if pids[g.pid] == 1 else g.socket)
    return " or ".join(f"{host}:{shlex.quote(t)}" for t in targets)


def find_remote_job(remotes: list[Remote]) -> list[tuple[Remote, LiveJob]]:
    """The job each host's ``NAME`` (a run name or run id) names, one ``ls`` through ssh per host; a one-line
    TuiwatchError when a host has no such job or two hosts claim the same rank."""
    found: list[tuple[Remote, LiveJob]] = []
    owner: dict[int, str] = {}
    for remote in remotes:
        if remote.name is None:
            raise TuiwatchError(f"give the run on {remote.host} as {remote.host}:NAME (several hosts: one job)")
        grouped = group_jobs(list_remote_runs(remote))
        jobs = [g for g in grouped if isinstance(g, LiveJob) and remote.name in (g.name, g.run_id)]
        if not jobs:
            names = ", ".join(sorted({g.name for g in grouped})) or "none"
            raise TuiwatchError(f"no live job of several ranks named {remote.name!r} on {remote.host} (live: {names})")
        if len(jobs) > 1:
            ids = ", ".join(j.run_id for j in jobs)
            raise TuiwatchError(f"{len(jobs)} jobs named {remote.name!r} on {remote.host} ({ids}): give the run id")
        job = jobs[0]
        for run in job.ranks:
            rank = run.rank or 0
            if rank in owner:
                raise TuiwatchError(
                    f"rank {rank} is on both {owner[rank]} and {remote.host}: not one job (name it by run id)"
                )
            owner[rank] = remote.host
        found.append((remote, job))
    return found


def parse_ranks(text: str) -> set[int]:
    """``--ranks 0,2,4-7`` as a set of ranks; a one-line TuiwatchError for anything else."""
    ranks: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            lo, hi = int(first), int(last or first)
            if lo < 0 or hi < lo or hi - lo > 1 << 16:
                raise ValueError
            ranks.update(range(lo, hi + 1))
    except ValueError:
        raise TuiwatchError(f"--ranks takes ranks like 0,2,4-7 (got {text!r})") from None
    return ranks
