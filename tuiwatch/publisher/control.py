"""Viewer commands in flight: received on the publisher thread, run by the training thread.

The only moment model, optimizer and data are consistent is a step boundary,
so the publisher thread only queues a command and wakes the training thread
(which may be paused); the training thread runs every queued command, in
order, at its next boundary (or, for a command with ``at``, at the first
boundary with that many steps done). Each id runs once: a repeated id is
refused.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from tuiwatch.errors import TuiwatchError
from tuiwatch.wire.protocol import Command

SEEN_IDS = 4096
# Command ids waiting for the next step boundary, at most: 3,000 dumps in one write once blocked training for
# 110 s and wrote 3,300 dump directories. Beyond it a command is refused "busy", at once.
MAX_QUEUED = 16


class CommandRefused(TuiwatchError):
    """A command that cannot run now (pause while paused, resume while running); the message is the reply's error."""


@dataclass
class Queued:
    """One command to run at the boundary, and the ids of the same command sent while it waited."""

    command: Command
    also: list[int] = field(default_factory=list)  # answered with the same result: one run, one reply per id


class CommandQueue:
    def __init__(self) -> None:
        self._items: deque[Queued] = deque()
        self._lock = threading.Lock()  # held for list operations only, never across I/O
        self._seen: set[int] = set()
        self._seen_order: deque[int] = deque()
        self.wake = threading.Event()

    def offer(self, command: Command) -> str | None:
        """Queue ``command`` (publisher thread); the reason it is refused, or None."""
        if command.id in self._seen:
            return f"command id {command.id} was already received; each id runs once"
        with self._lock:
            waiting = sum(1 + len(q.also) for q in self._items)  # ids, the joined ones included
            if waiting >= MAX_QUEUED:
                return f"busy: {waiting} commands already wait for the next step boundary; send it again later"
            same = next((q for q in self._items if q.command.cmd == command.cmd and q.command.at == command.at), None)
            if same is not None:
                # Twice the same at one boundary is once: two dumps would write the same batch twice.
                same.also.append(command.id)
            else:
                self._items.append(Queued(command))
        self._seen.add(command.id)
        self._seen_order.append(command.id)
        if len(self._seen_order) > SEEN_IDS:
            self._seen.discard(self._seen_order.popleft())
        self.wake.set()
        return None

    def __bool__(self) -> bool:
        return bool(self._items)

    def take(self, steps_done: int) -> list[Queued]:
        """The queued commands due with ``steps_done`` steps done, oldest first (training thread); nothing
        joins them once taken."""
        with self._lock:
            taken = [q for q in self._items if q.command.at is None or q.command.at <= steps_done]
            if len(taken) == len(self._items):
                self._items.clear()
            else:
                for q in taken:
                    self._items.remove(q)
        return taken
