"""The few messages a source posts to the app (thread-safe through ``post_message``).

``rank`` is set by a :class:`~tuiwatch.viewer.sources.RanksSource` on what each of its ranks' sources posts:
which rank of a job the message is about (None: a run of one process).
"""

from __future__ import annotations

from textual.message import Message

from tuiwatch.ledger.records import Record


class RecordsReceived(Message):
    """A batch of records, in ledger order."""

    def __init__(self, records: list[Record]) -> None:
        super().__init__()
        self.records = records
        self.rank: int | None = None


class SourceConnected(Message):
    """A (re)connection: the stream starts again at the run record."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.rank: int | None = None


class SourceDisconnected(Message):
    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason
        self.rank: int | None = None


class SourceEnded(Message):
    """A finite source (a ledger file without --follow) has given everything it has."""

    def __init__(self) -> None:
        super().__init__()
        self.rank: int | None = None


class SourceProgress(Message):
    """How much of a ledger file a replay has read: the header shows it until the file is read."""

    def __init__(self, percent: int) -> None:
        super().__init__()
        self.percent = percent
        self.rank: int | None = None


class SourceUntrusted(Message):
    """What the source reached is not the run (a TCP peer that could not prove the token): nothing was read."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason
