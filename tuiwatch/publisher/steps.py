"""``StepTracker``: the training thread's count of steps; opens one at each boundary, hands it on when it ends.

Every part of a Watch that adds to a step (the loader wrapper, the hooks,
``log``, the failure handlers) goes through one tracker, so there is one step
number, one current step and one place that decides whether a step is
recorded (``every``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from tuiwatch.ledger.records import RESERVED_METRIC_NAMES
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.deferred import PendingDuration, defer, defer_tensor, device_mark
from tuiwatch.publisher.dumps import KeptBatch, RecentBatches
from tuiwatch.publisher.pending import DeviceMemory, EvalState, StepState


class StepTracker:
    def __init__(self, pipeline: Pipeline, model: torch.nn.Module, device: torch.device, every: int):
        self.pipeline = pipeline
        self.model = model
        self.every = every
        self.cuda_index = device.index if device.type == "cuda" else None
        self.off = False  # closed, or a forked child: nothing is recorded any more
        self.step = 0  # steps opened so far: the number the next step gets
        self.epoch = -1
        self.opt_steps = 0
        self.batch_index = 0  # batches drawn in the current epoch: the data position of a checkpoint
        self.cur: StepState | None = None
        self.eval: EvalState | None = None
        self.last_boundary = time.perf_counter()
        self.last_batch: KeptBatch | None = None  # what a dump on request saves
        self.recent = RecentBatches()

    def measured(self, s: StepState) -> bool:
        """Whether ``s`` is one of the steps ``every`` records."""
        return s.step % self.every == 0

    def open(self, start: float, *, at_boundary: bool = False) -> StepState:
        s = StepState(self.step, start)
        if at_boundary and self.cuda_index is not None and not s.step % self.every:
            s.device_start = device_mark()
        self.step += 1
        self.cur = s
        self.last_boundary = start
        return s

    def current(self) -> StepState:
        """The open step; a loop that logs before its first boundary gets one opened for it."""
        return self.cur or self.open(self.last_boundary)

    def keep_batch(self, s: StepState, batch: Any, ids: list[int] | None) -> None:
        kept = KeptBatch(s.step, batch, ids, s.batch.nbytes if s.batch is not None else 0)
        self.last_batch = kept
        if s.batch is not None:
            self.recent.keep(kept)

    def end(self, now: float) -> None:
        """Close the open step, if any, and put it in the pipeline's buffer (the one thing done at a boundary)."""
        s = self.cur
        if s is None:
            return
        self.cur = None
        self.last_boundary = now
        if s.step % self.every and not s.step_forced:
            return
        if s.batch is None and not s.metrics and s.grad_norm is None and s.opt_step is None:
            return  # an empty step (a boundary with nothing in it) is not a step
        s.compute_s = now - s.started
        if s.device_start is not None:
            s.compute_s = PendingDuration(s.device_start, device_mark(), s.compute_s)
        s.training = self.model.training
        s.t_end = time.time()
        index = self.cuda_index
        if index is not None:
            s.mem = DeviceMemory(
                torch.cuda.memory_allocated(index),
                torch.cuda.memory_reserved(index),
                torch.cuda.max_memory_allocated(index),
            )
            torch.cuda.reset_peak_memory_stats(index)
        # Still a tensor only when clipped through watch.clip_grad_norm_ without an optimizer step.
        s.grad_norm = defer_tensor(s.grad_norm)
        self.pipeline.put(s)

    def last_step_number(self) -> int | None:
        """The step the run is at for a command's reply: the last one opened."""
        return self.step - 1 if self.step else None


def add_metrics(target: dict[str, Any], metrics: dict[str, Any]) -> None:
    """What ``watch.log(**metrics)`` adds to a step or an eval; a one-line error for what it cannot record."""
    for key, value in metrics.items():
        if key in RESERVED_METRIC_NAMES:
            raise ValueError(f"tuiwatch: '{key}' is a field tuiwatch records itself; log it under another name")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"tuiwatch: log({key}=...) needs a scalar, got a tensor of shape {list(value.shape)}")
            target[key] = defer(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            target[key] = value
        else:
            raise TypeError(f"tuiwatch: log({key}=...) needs a number or a scalar tensor, got {type(value).__name__}")
