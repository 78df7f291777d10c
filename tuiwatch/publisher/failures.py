"""When a step fails: an OOM is recorded and goes on unchanged; a non-finite gradient stops or skips the update.

Both are the rare moments the training thread waits for the publisher thread
(``Pipeline.sync``): the failing step and its alert must be in the ledger,
and the dump on disk, before the exception goes on (an OOM, up to 5 s) or
``NonFiniteError`` is raised (up to 30 s). The run is ending or failing anyway.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from tuiwatch.errors import NonFiniteError
from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.deferred import resolve
from tuiwatch.publisher.dumps import DumpWriter
from tuiwatch.publisher.pending import StepState
from tuiwatch.publisher.steps import StepTracker

STOP_SYNC_S = 30.0
OOM_SYNC_S = 5.0


def _scalar(value: Any) -> float:
    return float(resolve(value))  # a tensor is read with .item(): off the hot path, the run is stopping


def first_failing_boundary(s: StepState) -> tuple[str, list[str]]:
    """Walk the chain data → model → loss → gradients; off the hot path (it syncs). The first boundary that failed,
    and those before it that were not checked (a batch the Watch did not see, a forward past its hook)."""
    checks: list[tuple[str, Any]] = [
        ("batch", s.batch.probe() if s.batch is not None else None),
        ("forward", s.forward_probe),
        ("loss", s.metrics.get("loss")),
    ]
    unchecked = []
    for boundary, value in checks:
        if value is None:
            unchecked.append(boundary)
        elif not math.isfinite(_scalar(value)):
            return boundary, unchecked
    return "grad", unchecked


def _no_dump_reason(run_dir: Directory | None) -> str:
    return "none (no run directory)" if run_dir is None else "none (the nonfinite rule is off)"


class Failures:
    def __init__(
        self,
        tracker: StepTracker,
        dumps: DumpWriter,
        model: torch.nn.Module,
        *,
        on_nonfinite: str,
        close: Callable[[str], None],
    ):
        self.tracker = tracker
        self.dumps = dumps
        self.model = model
        self.on_nonfinite = on_nonfinite
        self.close = close  # the Watch's: a non-finite stop ends the run
        self._oom_seen = 0  # id() of the last OOM recorded, so that each is recorded once

    def record_oom(self, failure: BaseException) -> None:
        """Write the failing step with an ``oom`` field, let the rule fire and the dump land; the caller re-raises."""
        tracker = self.tracker
        if tracker.off or self._oom_seen == id(failure):
            return
        self._oom_seen = id(failure)
        s = tracker.current()
        message = str(failure).strip().splitlines()
        oom: dict[str, Any] = {"error": type(failure).__name__, "message": message[0][:300] if message else ""}
        index = tracker.cuda_index
        if index is not None:
            oom["mem_allocated"] = torch.cuda.memory_allocated(index)
            oom["mem_reserved"] = torch.cuda.memory_reserved(index)
        else:
            import psutil

            oom["rss"] = psutil.Process().memory_info().rss
        s.oom = oom
        if not s.measured:
            s.step_forced = True
        tracker.end(time.perf_counter())
        tracker.pipeline.sync(OOM_SYNC_S)

    def nonfinite_gradients(self, s: StepState, params: list[torch.Tensor]) -> None:
        """A non-finite gradient norm before the update: skip it (``skip``) or stop the run (``stop``)."""
        s.opt_skipped = True
        if self.on_nonfinite == "skip":
            # Optimizers leave parameters without a grad untouched, state included.
            for p in params:
                p.grad = None
            return
        boundary, unchecked = first_failing_boundary(s)
        step = s.step
        loss = s.metrics.get("loss")
        loss_text = "loss n/a" if loss is None else f"loss {_scalar(loss):.4g}"
        norm = _scalar(s.grad_norm)
        # The bad update was not applied: these are the last healthy weights, for the dump.
        self.dumps.hold_weights(step, self.model.state_dict())
        self.tracker.end(time.perf_counter())
        self.tracker.pipeline.sync(STOP_SYNC_S)  # the nonfinite rule fires and its dump is written
        dump = self.dumps.written(step, "nonfinite")
        self.close("nonfinite")
        raise NonFiniteError(
            f"nonfinite: first at step {step}, boundary={boundary} ({loss_text}, grad norm {norm}"
            + (f"; not checked before it: {', '.join(unchecked)}" if unchecked else "")
            + "); "
            f"the optimizer step was not taken; dump: {dump or _no_dump_reason(self.dumps.run_dir)}",
            step=step,
            boundary=boundary,
            dump=dump,
        )
