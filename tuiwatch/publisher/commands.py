"""Viewer commands (``c d p s``): received on the publisher thread, run by the training thread at a step boundary.

The only moment model, optimizer and data are consistent is a step boundary,
so the publisher thread only queues a command (:mod:`tuiwatch.publisher.control`)
and the training thread runs every queued one, in order, at its next
boundary, and puts each reply, an ``action`` record, into the pipeline. A
pause is a wait at the boundary that keeps serving commands.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tuiwatch.analysis.format import size
from tuiwatch.errors import StopRequested, TuiwatchError
from tuiwatch.ledger.records import ActionRecord, action_record
from tuiwatch.publisher.checkpoints import CheckpointError, write_checkpoint
from tuiwatch.publisher.control import CommandQueue, CommandRefused
from tuiwatch.publisher.dumps import DumpWriter
from tuiwatch.publisher.steps import StepTracker
from tuiwatch.wire.protocol import Command

# A viewer's dumps: at most one a second, and only with room for the batch and this much to spare.
MIN_DUMP_INTERVAL_S = 1.0
DUMP_SPARE_BYTES = 64 << 20
NO_RUN_DIR = "this run has no run directory (Watch(run_dir=None)): nowhere to write"


class CommandRunner:
    def __init__(
        self,
        tracker: StepTracker,
        dumps: DumpWriter,
        checkpoint_state: Callable[[], dict[str, Any]],
        *,
        stop_mode: str,
        checkpoint_with: Callable[[], str] | None = None,
    ):
        self.tracker = tracker
        self.dumps = dumps
        self.checkpoint_state = checkpoint_state
        self.checkpoint_with = checkpoint_with  # an integration's own checkpoint (the Trainer's): where it goes
        self.stop_mode = stop_mode  # "flag": should_stop is set; "raise": StopRequested at the boundary
        self.queue = CommandQueue()
        self.paused = False
        self.should_stop = False
        self._last_dump = -math.inf  # monotonic time of the last dump a viewer asked for

    def pending(self) -> bool:
        """Whether the boundary has anything to do: one truthiness test when nothing is queued."""
        return bool(self.queue) or self.paused

    def on_command(self, command: Command) -> ActionRecord | None:
        """Publisher thread: queue the command; the training thread replies when it has run it."""
        refused = RUN_ENDED if self.tracker.off else self.queue.offer(command)
        if refused is None:
            return None
        return action_record(
            command.cmd, cmd_id=command.id, ok=False, step=self.tracker.last_step_number(), error=refused
        )

    def at_boundary(self) -> None:
        """Run queued commands; while paused, block here (no spinning) and keep serving commands."""
        tracker = self.tracker
        if tracker.off:
            return
        while True:
            self.queue.wake.clear()
            stop = False
            for queued in self.queue.take(tracker.step):
                reply = self._run(queued.command)
                tracker.pipeline.put(reply)
                for cmd_id in queued.also:
                    twin = reply.copy()
                    twin["id"], twin["coalesced_with"] = cmd_id, queued.command.id
                    tracker.pipeline.put(twin)
                stop = stop or (queued.command.cmd == "stop" and reply["ok"])
            if stop and self.stop_mode == "raise":
                raise StopRequested(f"a viewer asked the run to stop at step {tracker.step}")
            if not self.paused or tracker.off:
                return
            self.queue.wake.wait(1.0)

    def _run(self, command: Command) -> ActionRecord:
        step = self.tracker.last_step_number()
        result: dict[str, Any] = {}
        try:
            if command.cmd == "checkpoint":
                result = self.checkpoint()
                result["dump"] = self._dump("checkpoint")
            elif command.cmd == "dump":
                result = {"path": self._dump("request")}
            elif command.cmd == "pause":
                if self.paused:
                    raise CommandRefused("the run is already paused; send resume")
                self.paused = True
            elif command.cmd == "resume":
                if not self.paused:
                    raise CommandRefused("the run is not paused")
                self.paused = False
            elif command.cmd == "stop":
                self.should_stop = True
                self.paused = False
                try:
                    result = self.checkpoint()
                except CheckpointError as exc:
                    result = {"checkpoint_error": str(exc)}  # the stop itself still happens
        except TuiwatchError as exc:
            return action_record(command.cmd, cmd_id=command.id, ok=False, step=step, error=str(exc))
        except Exception as exc:  # a failed command never stops training
            return action_record(
                command.cmd, cmd_id=command.id, ok=False, step=step, error=f"{type(exc).__name__}: {exc}"[:300]
            )
        reply = action_record(command.cmd, cmd_id=command.id, ok=True, step=step, path=result.pop("path", None))
        reply.update(result)  # type: ignore[typeddict-item]
        return reply

    def checkpoint(self) -> dict[str, Any]:
        if self.checkpoint_with is not None:
            return {"path": self.checkpoint_with(), "steps_done": self.tracker.step}
        if self.dumps.run_dir is None:
            raise CheckpointError(NO_RUN_DIR)
        steps = self.tracker.step
        path, size = write_checkpoint(self.dumps.run_dir, steps, self.checkpoint_state())
        return {"path": str(path), "bytes": size, "steps_done": steps}

    def _dump(self, reason: str) -> str:
        if self.dumps.run_dir is None:
            raise CommandRefused(NO_RUN_DIR)
        now = time.monotonic()
        if reason == "request" and now - self._last_dump < MIN_DUMP_INTERVAL_S:
            raise CommandRefused(f"a dump was written {now - self._last_dump:.1f} s ago: at most one a second")
        tracker = self.tracker
        kept = tracker.last_batch
        need = (kept.nbytes if kept is not None else 0) + DUMP_SPARE_BYTES
        free = self.dumps.run_dir.free_bytes()
        if free < need:
            raise CommandRefused(f"not enough space for a dump in {self.dumps.run_dir.path}: {size(free)} free")
        self._last_dump = now
        fallback = max(tracker.step - 1, 0)
        return self.dumps.on_request(reason, tracker.last_batch, fallback, list(tracker.pipeline.recent))


RUN_ENDED = "the run has ended"


def refused_after_end(command: Command) -> ActionRecord:
    """The reply to a command that reaches a run whose Watch was collected unclosed (collected.py)."""
    return action_record(command.cmd, cmd_id=command.id, ok=False, step=None, error=RUN_ENDED)
