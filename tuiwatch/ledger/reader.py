"""Reading a ledger file: every complete record, never an exception for a bad line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import DecodeError, decode
from tuiwatch.ledger.records import Decoded

LEDGER_NAME = "ledger.jsonl"
MAX_SIDE_FILE_BYTES = 16 << 20  # a dump's dump.json, cuda_memory.txt, a token file: small by construction


def read_small(path: Path, limit: int = MAX_SIDE_FILE_BYTES) -> bytes:
    """A small file's bytes; a one-line error when it is larger than ``limit`` (read no further than that)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise TuiwatchError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise TuiwatchError(f"{path} is over {limit >> 10} KiB: not a file tuiwatch wrote (or it was altered)")
    return data


def ledger_path(path: str | Path, latest: bool = False) -> Path:
    """The ledger file for ``path``: the file itself, ``ledger.jsonl`` in a run directory, or the one run in a
    directory of runs (``runs/``). A directory of several runs: the newest when ``latest`` (replay), else a
    one-line error that lists them (report, diff: which one is meant is not ours to guess)."""
    p = Path(path)
    if p.is_dir() and not (p / LEDGER_NAME).is_file():
        runs = sorted((d / LEDGER_NAME for d in p.iterdir() if (d / LEDGER_NAME).is_file()), key=_mtime)
        if len(runs) == 1 or (runs and latest):
            return runs[-1]
        if runs:
            names = ", ".join(r.parent.name for r in runs[-5:])
            raise TuiwatchError(f"{path} holds {len(runs)} runs (newest: {names}): give one run directory")
    if p.is_dir():
        p = p / LEDGER_NAME
    if not p.is_file():
        raise TuiwatchError(f"no ledger at {path}: give a ledger.jsonl file, a run directory or a directory of runs")
    return p


def _mtime(ledger: Path) -> float:
    try:
        return ledger.stat().st_mtime
    except OSError:
        return 0.0


# No record tuiwatch writes comes near this (a step line stays under 64 KiB); a longer line is not a record.
MAX_RECORD_BYTES = 16 << 20


class LedgerReader:
    """Iterates over the records of a ledger file.

    A torn last line (the writer died mid-write) and any other line that is not
    a JSON object are skipped and counted in :attr:`skipped`; the reader never
    raises for file content.
    """

    def __init__(self, path: str | Path):
        self.path = ledger_path(path)
        self.skipped = 0
        self.torn_tail = False

    def __iter__(self) -> Iterator[Decoded]:
        self.skipped = 0
        self.torn_tail = False
        with open(self.path, "rb") as f:
            while line := f.readline(MAX_RECORD_BYTES + 1):
                if len(line) > MAX_RECORD_BYTES and not line.endswith(b"\n"):
                    # A line longer than any record (3 GB without a newline read until MemoryError): skipped
                    # in bounded chunks up to its end, and counted.
                    while (rest := f.readline(MAX_RECORD_BYTES + 1)) and not rest.endswith(b"\n"):
                        pass
                    self.skipped += 1
                    continue
                if not line.strip():
                    continue
                try:
                    yield decode(line)
                except DecodeError:
                    self.skipped += 1
                    if not line.endswith(b"\n"):
                        self.torn_tail = True


def read_ledger(path: str | Path) -> LedgerReader:
    """Records of the ledger at ``path`` (a ``ledger.jsonl`` or a run directory).

    ``list(read_ledger(p))`` gives the records; the reader's ``skipped`` then
    says how many lines could not be read (a torn last line after a crash).
    """
    return LedgerReader(path)


def tail_records(path: str | Path, max_bytes: int = 256 * 1024) -> list[Decoded]:
    """The complete records in the last ``max_bytes`` of a ledger, oldest first."""
    p = ledger_path(path)
    with open(p, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read()
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]  # the first line is probably cut
    records = []
    for line in lines:
        if line.strip():
            try:
                records.append(decode(line))
            except DecodeError:
                continue
    return records
