"""What a killed run leaves beside its ledger: half-written checkpoints and dumps under temporary names.

A checkpoint or a dump is written under ``.tmp-<name>-<pid>`` and renamed into
place; SIGKILL in between leaves the temporary one (37 of 55 kills during
checkpoint writes), and since every run gets a new run directory, no later
write in the same directory ever sweeps it: gigabytes for a big model. Every
new Watch and ``tuiwatch doctor`` sweep the run directories under their root
for temporaries whose process is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

_TEMP = re.compile(r"^\.tmp-.+-(\d+)$")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts: it may still be writing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*"))


def _own_real_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def sweep_stale_temps(root: Path) -> tuple[int, int]:
    """Remove ``<root>/<run>/{checkpoints,dumps}/.tmp-*-<pid>`` of dead processes: (how many, bytes freed)."""
    removed = freed = 0
    for parent in (*root.glob("*/checkpoints"), *root.glob("*/dumps")):
        if not (_own_real_dir(parent.parent) and _own_real_dir(parent)):
            continue  # a symlink planted in a shared root must not lead the sweep to the user's other files
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for entry in entries:
            found = _TEMP.match(entry.name)
            if found is None or pid_alive(int(found.group(1))):
                continue
            try:
                size = _size(entry)
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            except OSError:
                continue
            removed, freed = removed + 1, freed + size
    return removed, freed
