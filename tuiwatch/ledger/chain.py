"""A run resumed from a checkpoint: its ledger links to the ledger of the run that wrote the checkpoint.

The link is the run record's ``resumed_from`` (``Watch(resume_from=...)``) or
a ``resumed`` record (``watch.restore(...)``): the checkpoint, its step, and
the earlier run's name, id and ledger. :func:`read_run` follows the links back
and puts the earlier parts first, each cut at the step where the next part
took over, so that ``report`` sees one run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record

# A chain longer than this is cut: a run resumed more often than that is not what a report is for.
MAX_LINKS = 32


def resumed_from(records: Iterable[Record]) -> Mapping[str, Any] | None:
    """Where this run was resumed from: the run record's ``resumed_from``, else the first ``resumed`` record's."""
    for r in records:
        kind = r.get("kind")
        if kind in ("run", "resumed"):
            link = r.get("resumed_from")
            if isinstance(link, Mapping):
                return link
        elif kind == "step":
            return None  # a link is written before the first step
    return None


@dataclass
class Part:
    """One ledger of the chain: where it is, and the step from which the next part took over (None: the last)."""

    path: str
    until: int | None = None

    def iter_records(self, count: Callable[[int], None]) -> Iterator[Record]:
        """Its records, read as they are used (a 200k-step ledger is never held whole); ``count`` gets the
        number of unreadable lines once the file is read."""
        reader = read_ledger(self.path)
        yield from (reader if self.until is None else before(reader, self.until))
        count(reader.skipped)


@dataclass
class RunChain:
    parts: list[Part]
    missing: str | None = None  # the earlier ledger a link names but that could not be read, and why
    skipped: int = 0  # unreadable lines over all parts, once iter_records() has read them
    links: list[Mapping[str, Any]] = field(default_factory=list)  # newest first

    def iter_records(self) -> Iterator[Record]:
        """The run's records in order, streamed: each earlier part up to the step the next one resumed from."""
        self.skipped = 0

        def count(n: int) -> None:
            self.skipped += n

        for part in self.parts:
            yield from part.iter_records(count)

    @property
    def records(self) -> list[Record]:
        return list(self.iter_records())


def before(records: Iterable[Record], step: int) -> Iterator[Record]:
    """An earlier part's records up to a resume at ``step``: no end, the steps and evals before it."""
    last_t: float | None = None
    for r in records:
        kind = r.get("kind")
        s = integer(r.get("step"))
        if kind == "end" or (s is not None and s >= step and kind in ("step", "eval", "alert", "action")):
            continue
        if kind == "step":
            last_t = num(r.get("t"))
        t = num(r.get("t"))
        if kind == "system" and last_t is not None and t is not None and t > last_t + 1.0:
            continue  # sampled after the last kept step: the part the next ledger replaced
        yield r


def _head(path: str | Path) -> tuple[Path, list[Record]]:
    """A ledger's path and its first records, up to the first step: where a link is, if any."""
    reader = read_ledger(path)
    head: list[Record] = []
    for r in reader:
        head.append(r)
        if r.get("kind") == "step" or len(head) >= HEAD_RECORDS:
            break
    return reader.path, head


def read_run(path: str | Path) -> RunChain:
    """The ledger at ``path`` and the earlier ledgers it resumed from, oldest first (read when iterated)."""
    newest, head = _head(path)
    chain = RunChain([Part(str(newest))])
    _follow(chain, resumed_from(head), newest)
    return chain


def earlier_parts(path: str | Path) -> RunChain:
    """Only the earlier parts of the run whose newest ledger is ``path`` (what a replay shows first)."""
    newest, head = _head(path)
    chain = RunChain([])
    _follow(chain, resumed_from(head), newest)
    return chain


# A link is written before the first step: this many records in, there is none.
HEAD_RECORDS = 64


def _follow(chain: RunChain, link: Mapping[str, Any] | None, newest: Path) -> None:
    """Put the parts ``link`` leads back to at the front of ``chain``, oldest first."""
    seen = {newest.resolve()}
    while link is not None and len(chain.links) < MAX_LINKS:
        chain.links.append(link)
        step, earlier = integer(link.get("step")), link.get("ledger")
        if step is None or not isinstance(earlier, str):
            chain.missing = "the link names no ledger"
            return
        try:
            older, head = _head(earlier)
            if older.resolve() in seen:
                chain.missing = f"{earlier} links back to a later part"
                return
        except (TuiwatchError, OSError) as exc:
            chain.missing = f"{earlier}: {exc}"
            return
        seen.add(older.resolve())
        chain.parts.insert(0, Part(str(older), until=step))
        link = resumed_from(head)
