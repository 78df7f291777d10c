"""How a run's files are made: private, never through a symlink, and never seen half-written.

Checkpoints and dumps are written under a hidden temporary name, fsynced,
then renamed into place; the directory is fsynced too, so that the rename
itself survives a power cut. One rule for both, so they are equally durable.

What a run writes holds the model, its optimizer, its argv and its batches:
directories are 0700 and files 0600 (``TUIWATCH_SHARE=group`` makes them
0750 / 0640 for a team that reads each other's runs). New files are created
with ``O_EXCL | O_NOFOLLOW``, relative to a directory held open by
descriptor since it was made and checked (this user's, not a symlink), so
that another user who can write next to it, or rename it, cannot redirect a
write onto one of the user's own files.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import BinaryIO


def modes() -> tuple[int, int]:
    """(directory mode, file mode) of what a run writes: private, or group-readable on request."""
    if os.environ.get("TUIWATCH_SHARE") == "group":
        return 0o750, 0o640
    return 0o700, 0o600


class Directory:
    """A directory held open by descriptor since it was made or first checked.

    Every later write goes through the descriptor (``openat`` and friends), so
    it lands in this directory even if someone renames it and puts another in
    its place by name, and a symlink is never followed.
    """

    def __init__(self, path: Path, fd: int):
        self.path = path  # for messages and the paths shown; the descriptor is what is written through
        self.fd = fd

    @classmethod
    def open(cls, path: Path, parent: Directory | None = None, *, create: bool = False) -> Directory:
        """``path`` (``path.name`` inside ``parent`` when given) as a real directory of this user's."""
        name, where = (path.name, parent.fd) if parent is not None else (str(path), None)
        if create:
            with contextlib.suppress(FileExistsError):  # a file or a symlink by that name: the open says which
                os.mkdir(name, modes()[0], dir_fd=where)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=where)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OSError(f"{path} is a symlink or not a directory: tuiwatch writes only into its own") from None
            raise
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            os.close(fd)
            raise OSError(f"{path} belongs to uid {owner}, not to this user: tuiwatch writes only into its own")
        return cls(path, fd)

    def sub(self, name: str, *, create: bool = True) -> Directory:
        return Directory.open(self.where() / name, self, create=create)

    def where(self) -> Path:
        """Where the directory is now (it may have been renamed since it was opened), for the paths shown."""
        try:
            now = os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:  # no /proc (macOS): the name it was opened by
            return self.path
        return Path(now) if now.startswith("/") and not now.endswith(" (deleted)") else self.path

    def create(self, name: str) -> BinaryIO:
        """A new private file: it must not exist, not even as a symlink (``O_EXCL | O_NOFOLLOW``)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.fdopen(os.open(name, flags, modes()[1], dir_fd=self.fd), "wb")

    def write(self, name: str, data: bytes) -> None:
        with self.create(name) as f:
            f.write(data)

    def sync(self, name: str | None = None) -> None:
        """Flush a file's data, or (no name) this directory's entries, to the disk."""
        if name is None:
            os.fsync(self.fd)
            return
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def move_into_place(self, tmp: str, final: str) -> None:
        """Rename the fully written and synced ``tmp`` to ``final``, and make the rename durable."""
        os.rename(tmp, final, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        self.sync()

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def size(self, name: str) -> int:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size

    def free_bytes(self) -> int:
        st = os.fstatvfs(self.fd)
        return st.f_bavail * st.f_frsize

    def remove(self, name: str) -> None:
        """Remove a file, or a directory of files (a dump's temporary), by name; gone already is fine."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except IsADirectoryError:
            with self.sub(name, create=False) as inner:
                for entry in inner.names():
                    inner.remove(entry)
            os.rmdir(name, dir_fd=self.fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
