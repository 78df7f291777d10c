"""Starting a Watch's publishing in two phases, so that nothing is patched afterwards.

:func:`open_publishing` makes everything the run record names:

1. the run directory and the ledger store (or an in-memory tail);
2. the pipeline (not yet running);
3. the listeners: the Unix socket, then the optional TCP one with its token file;
4. the ``run`` record, which names all of the above, written first in the ledger.

The Watch then builds its parts on the pipeline, and :meth:`Publishing.start`
hands their callbacks over: the server is made with the bound listeners and
the run record's line, and the pipeline thread starts. Nothing reaches a
callback before its object exists.

An unsafe socket directory or a port in use never stops training: the run
goes on without that listener and says why, once, on stderr.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuiwatch.analysis.format import size
from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.litter import sweep_stale_temps
from tuiwatch.ledger.reader import LEDGER_NAME
from tuiwatch.ledger.records import AlertRecord, Record, RunRecord
from tuiwatch.ledger.writer import FileLedger, LedgerStore, MemoryTail
from tuiwatch.publisher.atomic import Directory, modes
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.background.server import TcpListener, bind_private_socket, open_tcp_listener
from tuiwatch.publisher.forksafe import ForkSafeLock
from tuiwatch.publisher.ranks import Ranks, new_rank_dir
from tuiwatch.publisher.run_record import make_run_record, new_run_dir, shared_root_warning
from tuiwatch.rules import Diagnosis
from tuiwatch.wire.protocol import Command
from tuiwatch.wire.socketdir import TCP_FILE_SUFFIX, ensure_socket_dir, free_socket_path, remove_stale_sockets
from tuiwatch.wire.tcp import exposure_warning, format_address


@dataclass
class Listeners:
    unix: socket.socket | None = None
    path: Path | None = None
    error: str | None = None  # why there is no Unix socket
    tcp: TcpListener | None = None


def open_store(run_dir: str | Path | None, name: str, ranks: Ranks) -> tuple[Directory | None, LedgerStore]:
    if run_dir is None:
        return None, MemoryTail()
    root = Path(run_dir).absolute()  # every path shown is absolute
    # Held open from here on: every later write goes into this directory, even if it is renamed or swapped.
    # A rank of a multi-rank job: its own directory inside the one the job's ranks on this host share.
    directory = new_rank_dir(root, name, ranks) if ranks.several else Directory.open(new_run_dir(root, name))
    warning = shared_root_warning(root)
    if warning is not None:
        print(f"tuiwatch: {name}: {warning}", file=sys.stderr)
    removed, freed = sweep_stale_temps(root)
    if removed:
        print(f"tuiwatch: {name}: removed {removed} half-written checkpoint/dump file(s) of killed runs "
              f"under {root} ({size(freed)})", file=sys.stderr)  # fmt: skip
    return directory, FileLedger(directory.path / LEDGER_NAME, modes()[1], dir_fd=directory.fd)


_binding = ForkSafeLock()


def open_listeners(name: str, tcp: tuple[str, int] | None) -> Listeners:
    with _binding:  # Watches started at once in two threads of one process must not pick the same free name
        return _open_listeners(name, tcp)


def _open_listeners(name: str, tcp: tuple[str, int] | None) -> Listeners:
    found = Listeners()
    try:
        directory = ensure_socket_dir()
        remove_stale_sockets(directory)
        wanted = free_socket_path(directory, name, os.getpid())
        found.unix, found.path = bind_private_socket(wanted), wanted
    except (TuiwatchError, OSError) as exc:
        found.error = str(exc) if isinstance(exc, TuiwatchError) else f"cannot listen: {exc}"
        # The Watch's start line says why. TCP viewers get the same stream: no Unix socket, no TCP either.
        return found
    if tcp is not None:
        try:
            found.tcp = open_tcp_listener(*tcp, wanted.with_suffix(TCP_FILE_SUFFIX))
        except OSError as exc:
            print(
                f"tuiwatch: no TCP listener at {format_address(*tcp)} ({exc.strerror or exc}); the Unix socket works",
                file=sys.stderr,
            )
        else:
            warning = exposure_warning(tcp[0], found.tcp.address)
            if warning is not None:
                print(f"tuiwatch: {name}: {warning}", file=sys.stderr)
    return found


@dataclass
class Publishing:
    """What a Watch publishes through: opened, then started once the Watch's parts exist."""

    pipeline: Pipeline
    run_record: RunRecord
    run_line: bytes
    run_dir: Directory | None
    ledger_path: Path | None
    listeners: Listeners

    @property
    def socket_path(self) -> Path | None:
        return self.listeners.path

    @property
    def tcp_address(self) -> str | None:
        return self.run_record["tcp"]

    def start(
        self,
        on_command: Callable[[Command], Record | None],
        on_alert: Callable[[AlertRecord, list[Record]], str | None],
        *,
        viewer_stall_s: float,
    ) -> None:
        """Serve viewers (when a socket was bound) and start the pipeline thread."""
        unix, path = self.listeners.unix, self.listeners.path
        if unix is not None and path is not None:
            self.pipeline.serve(
                unix, path, self.run_line, on_command, tcp_listener=self.listeners.tcp, stall_s=viewer_stall_s
            )
        self.pipeline.start(on_alert)


def open_publishing(
    *,
    name: str,
    run_dir: str | Path | None,
    tcp: tuple[str, int] | None,
    diagnosis: Diagnosis,
    queue_size: int,
    system_interval_s: float | None,
    device: torch.device,
    ranks: Ranks,
    run_info: dict[str, Any],
) -> Publishing:
    """Steps 1 to 4 above; ``run_info`` is what the run record says of the model and the Watch's settings."""
    directory, store = open_store(run_dir, name, ranks)
    pipeline = Pipeline(
        store,
        capacity=queue_size,
        system_interval_s=system_interval_s,
        cuda_device=device.index if device.type == "cuda" else None,
        diagnosis=diagnosis,
    )
    listeners = open_listeners(name, tcp)
    record = make_run_record(
        name=name,
        device=device,
        run_dir=directory.path if directory is not None else None,
        socket_path=listeners.path,
        socket_error=listeners.error,
        tcp_address=listeners.tcp.address if listeners.tcp is not None else None,
        ranks=ranks,
        **run_info,
    )
    run_line = encode(record)
    store.append(run_line)
    ledger_path = store.path if isinstance(store, FileLedger) else None
    return Publishing(pipeline, record, run_line, directory, ledger_path, listeners)
