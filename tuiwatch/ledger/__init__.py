"""Records, their fields, their JSON Lines codec and the ledger file (the wire protocol is tuiwatch.wire).

Pure: no torch, no Textual. Both the publisher and the viewer build on this room.
"""

from tuiwatch.ledger.codec import decode, encode
from tuiwatch.ledger.reader import LedgerReader, read_ledger
from tuiwatch.ledger.records import KINDS, SCHEMA, STEP_FIELDS, Record

__all__ = [
    "KINDS",
    "SCHEMA",
    "STEP_FIELDS",
    "LedgerReader",
    "Record",
    "decode",
    "encode",
    "read_ledger",
]
