"""Viewer commands in flight: received on the publisher thread, run by the training thread.

The only moment model, optimizer and data are consistent is a step boundary,
so the publisher thread only queues a command and wakes the training thread
(which may be paused); the training thread runs every queued command, in
order, at its next boundary. Each id runs once: a repeated id is refused.
"""

from __future__ import annotations

import threading
from collections import deque

from tuiwatch.errors import TuiwatchError
from tuiwatch.wire.protocol import Command

SEEN_IDS = 4096
# Commands waiting for the next step boundary, at most: 3,000 dumps in one write once blocked training for
# 110 s and wrote 3,300 dump directories. Beyond it a command is refused "busy", at once.
MAX_QUEUED = 16


class CommandRefused(TuiwatchError):
    """A command that cannot run now (pause while paused, resume while running); the message is the reply's error."""


class CommandQueue:
    def __init__(self) -> None:
        self._items: deque[Command] = deque()
        self._seen: set[int] = set()
        self._seen_order: deque[int] = deque()
        self.wake = threading.Event()

    def offer(self, command: Command) -> str | None:
        """Queue ``command`` (publisher thread); the reason it is refused, or None."""
        if command.id in self._seen:
            return f"command id {command.id} was already received; each id runs once"
        waiting = list(self._items)  # a copy: the training thread takes from the deque meanwhile
        if len(waiting) >= MAX_QUEUED:
            return f"busy: {len(waiting)} commands already wait for the next step boundary; send it again later"
        same = next((c for c in waiting if c.cmd == command.cmd and c.cmd in ("checkpoint", "dump")), None)
        if same is not None:
            # Two of them at one boundary would write the same state twice.
            return f"a {command.cmd} is already queued for the next step boundary (id {same.id})"
        self._seen.add(command.id)
        self._seen_order.append(command.id)
        if len(self._seen_order) > SEEN_IDS:
            self._seen.discard(self._seen_order.popleft())
        self._items.append(command)  # deque.append is atomic under the GIL
        self.wake.set()
        return None

    def __bool__(self) -> bool:
        return bool(self._items)

    def take(self) -> list[Command]:
        """Every queued command, oldest first (training thread)."""
        taken = []
        while self._items:
            taken.append(self._items.popleft())
        return taken
