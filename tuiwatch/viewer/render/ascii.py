"""``--theme ascii``: every character the viewer draws, as one that any terminal has. Pure.

For terminals and fonts without braille or box drawing (a serial console, an
old PuTTY, a screen reader's log). Each character is replaced by ASCII of the
same width in cells, so that what is drawn keeps its place: braille cells by
where their dots are (a line through a cell becomes ``|``, ``'``, ``-``, ``.``
or ``_``), borders by ``+ - |``, arrows and marks by their nearest letter.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from rich.cells import cell_len

_BRAILLE = 0x2800
# The rows (0 top .. 3 bottom) of a braille cell's dots, by bit: both columns.
_ROW_OF_BIT = {0x01: 0, 0x08: 0, 0x02: 1, 0x10: 1, 0x04: 2, 0x20: 2, 0x40: 3, 0x80: 3}

_BOXES = {
    "-": "─━┄┅┈┉╌╍═▔▁╴╶╸╺",
    "|": "│┃┆┇┋╎╏║▎▏▕┤├╵╷╹╻",
    "+": "┌┐└┘╭╮╰╯┬┴┼┏┓┗┛╔╗╚╝┍┑┕┙┎┒┖┚┝┥┯┷┿╋",
}
_SIGNS = {
    "┊": ":",  # where a compared run parts: dotted, not a stroke of the line
    "↑": "^",
    "↓": "v",
    "←": "<",
    "→": ">",
    "▲": "^",
    "▼": "v",
    "●": "*",
    "○": "o",
    "»": ">",
    "«": "<",
    "×": "x",
    "…": "~",
    "–": "-",
    "—": "-",
    "·": ".",
    "µ": "u",
    "°": "o",
    **dict.fromkeys("█▀▄▌▐▓▂▃▅▆▇", "#"),  # a thick border, a bar, a scrollbar's end
    "▒": ":",
    "░": ".",
    "�": "?",
}
TABLE = {ch: ascii_ch for ascii_ch, chars in _BOXES.items() for ch in chars} | _SIGNS


def braille(ch: str) -> str:
    """A braille cell as one character: none, a stroke through it, or a mark at the height of its dots."""
    bits = ord(ch) - _BRAILLE
    rows = [row for bit, row in _ROW_OF_BIT.items() if bits & bit]
    if not rows:
        return " "
    top, bottom = min(rows), max(rows)
    if bottom - top >= 2:
        return "|"
    middle = (top + bottom) / 2
    return "'" if middle < 0.75 else "-" if middle < 1.75 else "." if middle < 2.75 else "_"


@lru_cache(maxsize=4096)  # bounded: a run's name may bring any character
def _one(ch: str) -> str:
    if _BRAILLE <= ord(ch) < _BRAILLE + 256:
        return braille(ch)
    if ch in TABLE:
        return TABLE[ch]
    base = unicodedata.normalize("NFKD", ch)[:1]  # é: e
    if base.isascii() and base.isprintable() and cell_len(ch) == 1:
        return base
    # Anything else: a question mark a cell (a CJK character takes two; a combining mark none).
    return "?" * cell_len(ch)


def ascii_only(text: str) -> str:
    """``text`` with every character outside ASCII replaced by ASCII as wide."""
    if text.isascii():
        return text
    return "".join(ch if ch.isascii() else _one(ch) for ch in text)
