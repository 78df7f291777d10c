"""A module's lock that a forked child makes anew.

Another thread of the parent may hold it at the fork (starting or closing a
Watch), and no thread of the child ever releases it: a child that then starts
a Watch of its own (a hogwild worker, a rank forked by ``mp.spawn``'s fork
context) waited forever.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType


class ForkSafeLock:
    """For module-level locks only: the fork handler keeps the lock for the life of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._lock.release()
