"""``StepTracker``: the training thread's count of steps; opens one at each boundary, hands it on when it ends.

Every part of a Watch that adds to a step (the loader wrapper, the hooks,
``log``, the failure handlers) goes through one tracker, so there is one step
number, one current step and one place that decides whether a step is
recorded (``every``).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from typing import Any

import torch

from tuiwatch.ledger.records import RESERVED_METRIC_NAMES
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.deferred import PendingDuration, defer, defer_tensor, device_mark
from tuiwatch.publisher.dumps import DUMP_LAG, UNSIZED_BATCH_BYTES, KeptBatch, RecentBatches
from tuiwatch.publisher.late_probes import LateProbes
from tuiwatch.publisher.measure import BatchInfo
from tuiwatch.publisher.pending import DeviceMemory, EvalState, StepState

# The most sample ids one step records. A step that folds this many (batches drawn with no optimizer step to end
# it: a Fisher-information pass that backpropagates every batch of a dataset and never steps) records none.
MAX_STEP_IDS = 65_536


class StepTracker:
    def __init__(
        self, pipeline: Pipeline, model: torch.nn.Module, device: torch.device, every: int, *, per_optimizer: bool
    ):
        self.pipeline = pipeline
        self.model = model
        self.every = every
        self.per_optimizer = per_optimizer  # step_per="optimizer": micro-batches fold into the optimizer's step
        self.scaler: Any = None  # a GradScaler: its scale at each step's end tells a skipped step
        self.cuda_index = device.index if device.type == "cuda" else None
        self.off = False  # closed, or a forked child: nothing is recorded any more
        self.step = 0  # steps opened so far: the number the next step gets
        self.epoch = -1
        self.opt_steps = 0
        self.batch_index = 0  # batches drawn in the current epoch: the data position of a checkpoint
        self.cur: StepState | None = None
        self.left: StepState | None = None  # a step whose batch the loop left unused (leave()), until the next opens
        self.eval: EvalState | None = None
        # The model's mode at its last forward: a validation block without a forward of its own logs numbers
        # computed before it, and an evaluation that put the model back in train() before returning them ran in
        # eval mode all the same.
        self.forward_training: bool | None = None
        # The model's forwards in training mode so far: tuiwatch run tells an evaluation's batch by it.
        self.training_forwards = 0
        # ... when the optimizer last updated the model: equal, the model's last forward was a training step's, so a
        # validation block that ran none evaluated something else (an EMA or SWA copy), in a mode not seen.
        self.forwards_at_update = -1
        self.last_boundary = time.perf_counter()
        self.last_batch: KeptBatch | None = None  # what a dump on request saves
        self.recent = RecentBatches()
        self.late = LateProbes()  # which large CPU batch tensors the publisher thread probes
        self._held = 0  # batches in `recent` when the pipeline was last told
        # watch.fetching(): time spent fetching since the last boundary is the data wait of the
        # next step (the batch fetched), and not compute of the step it ran in.
        self.fetch_s: float | None = None
        self.next_wait: float | None = None
        # Without an optimizer to hook, the model's norms are read at the boundaries (hooks.py).
        self.on_open: Callable[[StepState], None] | None = None
        self.on_end: Callable[[StepState], None] | None = None
        # Whether the loop marks its steps (batches(), step(), end_step()); asked at the first update, where a loop
        # that has marked none is given steps that open at its training forwards (watch.py, _unmarked_loop).
        self.marked = False
        self.on_first_update: Callable[[], None] | None = None

    def fetched(self, seconds: float) -> None:
        self.fetch_s = (self.fetch_s or 0.0) + seconds

    def open(self, start: float, *, at_boundary: bool = False, data_wait_s: float | None = None) -> StepState:
        if self.left is not None:
            self._forget_left()
        s = StepState(self.step, start)
        s.measured = not self.step % self.every
        if at_boundary and self.cuda_index is not None and s.measured:
            s.device_start = device_mark()
        wait, self.next_wait = self.next_wait, None
        if wait is not None or data_wait_s is not None:
            s.data_wait_s = (wait or 0.0) + (data_wait_s or 0.0)
        self.step += 1
        self.cur = self.pipeline.open_step = s
        self.last_boundary = start
        if self.on_open is not None:
            self.on_open(s)
        return s

    def updated(self, s: StepState) -> None:
        """The optimizer updated the model in ``s``: one more optimizer step."""
        self.opt_steps += 1
        s.opt_step = self.opt_steps
        self.forwards_at_update = self.training_forwards
        if self.on_first_update is not None:
            first, self.on_first_update = self.on_first_update, None
            first()

    def trains(self, module: torch.nn.Module) -> bool:
        """Whether a forward of ``module`` now, with gradients enabled, is training's rather than an evaluation's.
        A model that never ran a forward in training mode trains in eval mode (fine-tuning with frozen BatchNorm
        statistics): all its forwards are."""
        return module.training or not self.training_forwards

    def current(self) -> StepState:
        """The open step; a loop that logs before its first boundary gets one opened for it."""
        return self.cur or self.open(self.last_boundary)

    def folding(self) -> bool:
        """Whether the next batch belongs to the open step: counting per optimizer step, before it stepped."""
        s = self.cur
        return self.per_optimizer and s is not None and s.opt_step is None and not s.opt_skipped

    def add_batch(self, s: StepState, batch: Any, ids: list[int] | None) -> None:
        s.batch_ids = ids
        if s.measured:
            s.batch = BatchInfo(batch, self.late)
        self.keep_batch(s, batch, ids)

    def fold(self, batch: Any, ids: list[int] | None, wait: float | None) -> None:
        """One more micro-batch into the open step: its ids, shape, tokens and data wait are added."""
        s = self.current()
        s.micro_batches += 1
        if wait is not None:
            s.data_wait_s = (s.data_wait_s or 0.0) + wait
            s.not_compute += wait  # inside the step's span: not compute
        held = s.batch_ids
        if held is None or ids is None or len(held) + len(ids) > MAX_STEP_IDS:
            s.batch_ids = None  # some micro-batch's ids unknown, or a step no optimizer closes (below)
        elif s.micro_batches == 2:
            s.batch_ids = [*held, *ids]  # a list of the step's own: the first is its batch's, which a dump keeps
        else:
            held.extend(ids)  # (a new list at every fold was quadratic in the micro-batches)
        if s.measured:
            info = BatchInfo(batch, self.late)
            if s.batch is None:
                s.batch = info
            else:
                s.folded.append(info)
        self.keep_batch(s, batch, ids)

    def keep_batch(self, s: StepState, batch: Any, ids: list[int] | None) -> None:
        info = s.batch
        nbytes = 0 if info is None else info.nbytes if info.seen and not info.unread else UNSIZED_BATCH_BYTES
        kept = KeptBatch(s.step, batch, ids, nbytes)
        self.last_batch = kept
        if s.batch is not None:
            held = self.recent.keep(kept)
            if held != self._held:  # the ring's length changes while it fills, or with the batches' sizes
                self._held = held
                self.pipeline.wake_within(held - DUMP_LAG)

    def end(self, now: float) -> None:
        """Close the open step, if any, and put it in the pipeline's buffer (the one thing done at a boundary)."""
        fetched, self.fetch_s = self.fetch_s, None
        if fetched is not None:
            self.next_wait = (self.next_wait or 0.0) + fetched
        s = self.cur
        if s is None:
            return
        self.cur = self.pipeline.open_step = None
        self.last_boundary = now
        if self.on_end is not None:
            self.on_end(s)
        if not s.worth_a_record():
            return
        s.compute_s = now - s.started - (fetched or 0.0) - s.not_compute
        if s.device_start is not None:
            end = s.evaluated_mark if s.evaluated_mark is not None else device_mark()  # (an evaluation: watch.py)
            s.compute_s = PendingDuration(s.device_start, end, s.compute_s)
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
        if self.scaler is not None:
            scale = getattr(self.scaler, "_scale", None)  # the tensor itself: get_scale() would sync on CUDA
            if isinstance(scale, torch.Tensor):
                s.scale = defer(scale)
        # The outputs' summed probe is read (forward_probe) and no forward of this step is left to add to it. Held
        # until the record is built, ~250 steps later, these small tensors fragmented the allocator under every
        # step's own: 15,000 instructions a step on the tiny MLP (bench/instructions.py).
        s.output_sum = None
        self.pipeline.put(s)

    def discard(self) -> None:
        """Forget the open step, the last one opened, as if it never was (``tuiwatch run``'s trailing batch that no
        optimizer step used, an evaluator's first batch): its number goes to the next step, and its batch is no
        longer one a dump of that number could find."""
        if self.cur is not None:
            self.leave()
            self._forget_left()

    def leave(self) -> None:
        """The loop left its loader right after drawing the open step's batch, before any use of it (a break out of
        the epoch): that step is not recorded and its number goes to the next. It is set aside until the next step
        opens, because a loop may be leaving by an exception: the run then ends in that step (put_back())."""
        s = self.cur
        if s is not None:
            self.cur = self.pipeline.open_step = None
            self.step -= 1
            self.left = s

    def put_back(self) -> None:
        """The run ends by an exception (close()): the step leave() set aside is the one it failed in."""
        s, self.left = self.left, None
        if s is not None and self.cur is None and self.step == s.step:
            self.cur = self.pipeline.open_step = s
            self.step += 1

    def _forget_left(self) -> None:
        """The loop went on: the step set aside was a batch it did not use. Its batch is no longer one a dump of its
        number could find (the next step's, kept after this, has it)."""
        s, self.left = self.left, None
        if s is not None:
            self.recent.forget(s.step)
            if self.last_batch is not None and self.last_batch.step == s.step:
                self.last_batch = None

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
        elif type(value) is float:
            target[key] = value  # the usual: a loss.item()
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            # numpy's scalars (sklearn's metrics), an IntEnum: the ledger's encoder takes only plain numbers. An int
            # past 64 bits cannot be written as a JSON number by it either: its float instead.
            number = int(value) if isinstance(value, numbers.Integral) else float(value)
            target[key] = float(number) if type(number) is int and not -(2**63) <= number < 2**63 else number
        else:
            raise TypeError(f"tuiwatch: log({key}=...) needs a number or a scalar tensor, got {type(value).__name__}")


def before_its_work(s: StepState) -> bool:
    """Whether the open step ``s`` has not begun its work yet: no forward, no optimizer step (a validation block at
    the top of a loop, after the boundary: nanoGPT's place)."""
    return s.forwards == 0 and s.opt_start is None


def set_aside(s: StepState, entered: float, left: float) -> None:
    """``s`` was open while a validation block ran from ``entered`` to ``left``: that is not its compute.

    Before the step's own work (nanoGPT evaluates at the top of its loop, after the boundary) the step
    starts again after the block, so its phases start there too (and on CUDA its device time: a new start
    mark). After it (an evaluation every N steps, once the optimizer has stepped) the block's host time is
    taken out of ``compute_s``; on CUDA the block's kernels stay in the step's device time.
    """
    if before_its_work(s):
        s.started += left - entered
        if s.device_start is not None:
            s.device_start = device_mark()
    else:
        s.not_compute += left - entered
