"""How a run's files are made: private, never through a symlink, and never seen half-written.

Checkpoints and dumps are written under a hidden temporary name, fsynced,
then renamed into place; the directory is fsynced too, so that the rename
itself survives a power cut. One rule for both, so they are equally durable.

What a run writes holds the model, its optimizer, its argv and its batches:
directories are 0700 and files 0600 (``TUIWATCH_SHARE=group`` makes them
0750 / 0640 for a team that reads each other's runs). New files are created
with ``O_EXCL | O_NOFOLLOW`` and directories are checked after creation, so
that another user who can write next to them cannot redirect a write onto
one of the user's own files with a symlink.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import BinaryIO


def modes() -> tuple[int, int]:
    """(directory mode, file mode) of what a run writes: private, or group-readable on request."""
    if os.environ.get("TUIWATCH_SHARE") == "group":
        return 0o750, 0o640
    return 0o700, 0o600


def private_dir(path: Path) -> Path:
    """``path`` made (or found) as a real directory of this user's: never a symlink or someone else's."""
    with contextlib.suppress(FileExistsError):  # a file or a symlink by that name: the check below says which
        path.mkdir(mode=modes()[0], exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is a symlink or not a directory: tuiwatch writes only into its own directories")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to this user: tuiwatch writes only into its own")
    return path


def create_file(path: Path) -> BinaryIO:
    """A new file at ``path`` for writing: it must not exist (not even as a symlink), and it is private."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, modes()[1]), "wb")


def write_file(path: Path, data: bytes) -> None:
    with create_file(path) as f:
        f.write(data)


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
