"""The ledgers of a multi-rank job, and their records merged into one stream (docs/distributed.md).

On disk, each rank of a job writes its own ledger in its own directory,
``<job>/rank<k>/ledger.jsonl`` (``rank<k>-2``… after a restart). Where the
ranks' records meet (``report``, the viewer), they are merged by step, never
by wall clock: the hosts' clocks differ, a step number does not.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from tuiwatch.ledger.reader import LEDGER_NAME
from tuiwatch.ledger.records import Decoded

_RANK_DIR = re.compile(r"rank(\d{1,6})(?:-(\d{1,6}))?")
# Kinds whose step says where in the run they belong; the others (system, publisher) follow the last one seen.
_STEPPED = frozenset(("step", "eval", "alert", "action"))


def rank_ledgers(path: str | Path) -> dict[int, Path]:
    """Rank → the ledger of its newest attempt, for a job directory; empty for anything else."""
    job = Path(path)
    found: dict[int, tuple[int, Path]] = {}
    try:
        entries = list(job.iterdir()) if job.is_dir() else []
    except OSError:
        return {}
    for entry in entries:
        match = _RANK_DIR.fullmatch(entry.name)
        ledger = entry / LEDGER_NAME
        if match is None or not ledger.is_file():
            continue
        rank, attempt = int(match[1]), int(match[2] or 1)
        if rank not in found or attempt > found[rank][0]:
            found[rank] = (attempt, ledger)
    return {rank: found[rank][1] for rank in sorted(found)}


def merge_ranks(streams: Mapping[int, Iterable[Decoded]]) -> Iterator[Decoded]:
    """Every rank's records in one stream, each tagged with its ``rank``, ordered by step, then rank.

    A record without a step (system samples, publisher counters) stays where
    it was in its own stream: after the step its rank had reached. Streams are
    read lazily, one record ahead each: memory does not grow with the run.
    """

    def keyed(rank: int, records: Iterable[Decoded]) -> Iterator[tuple[tuple[int, int], Decoded]]:
        reached = -1
        for record in records:
            step = record.get("step")
            if type(step) is int and record.get("kind") in _STEPPED and step > reached:
                reached = step  # never backwards: a ledger that goes back in steps keeps its own order
            record["rank"] = rank  # the stream's rank, whatever a line claims
            yield (reached, rank), record

    for _, record in heapq.merge(*(keyed(r, s) for r, s in streams.items()), key=lambda pair: pair[0]):
        yield record
