"""Putting a finished file or directory under its final name so that a crash never shows half of it.

Checkpoints and dumps are written under a hidden temporary name, fsynced,
then renamed into place; the directory is fsynced too, so that the rename
itself survives a power cut. One rule for both, so they are equally durable.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush a file's, or a directory's entries', data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_into_place(tmp: Path, final: Path) -> None:
    """Rename the fully written and fsynced ``tmp`` to ``final``, and make the rename durable."""
    os.rename(tmp, final)
    fsync_path(final.parent)
