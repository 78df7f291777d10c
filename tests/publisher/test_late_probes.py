"""A large CPU batch is probed for NaN/inf on the publisher thread, and each step still says its own batch's finiteness.

The training thread's sums are counted with a ``TorchFunctionMode``, which is
thread-local: the publisher thread's are not in the count.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tuiwatch.errors import NonFiniteError
from tuiwatch.publisher import late_probes
from tuiwatch.publisher.late_probes import HELD_BYTES, WARMUP, LateProbes
from tuiwatch.publisher.measure import BatchInfo
from tuiwatch.publisher.pending import StepState
from tuiwatch.publisher.watch import Watch

from ..helpers import watch_steps

ROWS, WIDTH = 512, 1024  # 2 MiB of float32: over HELD_BYTES
STEPS = 40
NAN_AT = 30  # after the warm-up
assert ROWS * WIDTH * 4 >= HELD_BYTES
assert WARMUP < NAN_AT


class CountSums(TorchFunctionMode):
    """Counts the sums this thread takes of tensors of ``ROWS`` rows (the batch's inputs, not the model's output)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.Tensor.sum, torch.sum) and isinstance(args[0], torch.Tensor) and args[0].shape[:1] == (ROWS,):
            self.count += int(args[0].dim() == 2 and args[0].shape[1] == WIDTH)
        return func(*args, **(kwargs or {}))


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(ROWS, WIDTH, generator=g) for _ in range(STEPS)]
    xs[NAN_AT][7, 3] = float("nan")
    return xs


def _train(
    watch: Watch, model: nn.Module, optimizer: torch.optim.Optimizer, batches: Any, *, in_place: bool = False
) -> int:
    """Trains on ``batches`` (each an input tensor), and returns how many of them this thread summed. ``in_place``:
    the loop cleans each batch in place (``x.nan_to_num_()``) once the Watch has it."""
    y = torch.zeros(ROWS, dtype=torch.long)
    sums = CountSums()
    with sums:
        for x in batches:
            watch.step(batch=(x, y))
            if in_place:
                x.nan_to_num_()
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return sums.count


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(WIDTH, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def test_a_large_cpu_batch_is_summed_off_the_training_thread_and_each_step_names_its_own(run_root: Path):
    model, optimizer = _model()
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, on_nonfinite="warn") as watch:
        summed = _train(watch, model, optimizer, _inputs())
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == list(range(STEPS))
    # The bad batch at its own step, and only there: the steps after it trained a broken model on finite batches.
    assert [s["step"] for s in steps if s["finite"]["batch"] is not True] == [NAN_AT]
    assert steps[NAN_AT]["finite"]["batch"] is False
    assert steps[NAN_AT + 1]["finite"]["forward"] is False
    assert steps[NAN_AT + 1]["finite"]["batch"] is True
    assert summed == WARMUP  # the warm-up's, at once; none after it


def test_a_loader_that_writes_every_batch_into_one_buffer_has_its_batches_probed_at_once(run_root: Path):
    """A prefetcher's pinned buffer: each batch is copied into the memory of the last. Held until the publisher
    thread got to it, a batch would be read after the next one was written over it."""
    model, optimizer = _model()
    buffer = torch.empty(ROWS, WIDTH)

    def loader() -> Any:
        for x in _inputs():
            buffer.copy_(x)
            yield buffer

    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, on_nonfinite="warn") as watch:
        summed = _train(watch, model, optimizer, loader())
    steps = watch_steps(watch)
    assert [s["step"] for s in steps if s["finite"]["batch"] is not True] == [NAN_AT]
    assert summed == STEPS  # the reuse was seen at the second batch: every probe at once


def test_a_loop_that_cleans_its_batch_in_place_has_its_batches_probed_at_once_as_the_loader_gave_them(run_root: Path):
    """``x.nan_to_num_()`` after the loader gave ``x``: summed late, the NaN would be gone and the step would say its
    batch was finite, where a probe at once (as before late probes, and in the warm-up) said it was not."""
    model, optimizer = _model()
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, on_nonfinite="warn") as watch:
        summed = _train(watch, model, optimizer, _inputs(), in_place=True)
    steps = watch_steps(watch)
    assert [s["step"] for s in steps if s["finite"]["batch"] is not True] == [NAN_AT]
    assert steps[NAN_AT]["finite"]["batch"] is False
    assert steps[NAN_AT]["finite"]["forward"] is True  # the model saw the batch cleaned
    assert summed == STEPS  # the change was seen at the second batch: every probe at once


def test_a_non_finite_large_batch_stops_the_run_naming_the_batch(run_root: Path):
    model, optimizer = _model()
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(NonFiniteError) as stopped:
        _train(watch, model, optimizer, _inputs())
    assert "boundary=batch" in str(stopped.value)
    steps = watch_steps(watch)
    assert steps[-1]["step"] == NAN_AT
    assert steps[-1]["finite"]["batch"] is False


def _after_warmup(late: LateProbes) -> list[torch.Tensor]:
    """Warm ``late`` up on fresh tensors (kept alive, as a loader's ring of batches would be)."""
    kept = [torch.zeros(ROWS, WIDTH) for _ in range(WARMUP)]
    for t in kept:
        assert BatchInfo((t,), late).held is None
    return kept


def test_a_held_tensor_a_loader_writes_over_before_its_probe_is_not_known():
    late = LateProbes()
    kept = _after_warmup(late)
    shared = torch.zeros(ROWS, WIDTH)
    first = BatchInfo((shared,), late)  # held: fresh memory after a clean warm-up
    assert first.held is not None
    shared[0, 0] = float("nan")  # the loader writes its next batch where the first one was
    second = BatchInfo((shared,), late)
    assert first.overwritten
    assert first.probe() is None
    assert second.held is None  # probed at once: NaN, its own
    assert math.isnan(second.probe())
    assert not late.on
    assert BatchInfo((torch.zeros(ROWS, WIDTH),), late).held is None  # at once for the rest of the run
    assert len(kept) == WARMUP


def test_a_held_tensor_the_loop_changed_in_place_before_its_probe_is_not_known():
    late = LateProbes()
    kept = _after_warmup(late)
    x = torch.zeros(ROWS, WIDTH)
    first = BatchInfo((x,), late)  # held: unchanged all through the warm-up
    assert first.held is not None
    x[0, 0] = float("nan")  # the loop writes into its batch (after the warm-up: not seen then)
    x.nan_to_num_()
    second = BatchInfo((torch.zeros(ROWS, WIDTH),), late)
    assert first.overwritten
    assert first.probe() is None  # what the loader gave is gone: not known, rather than the cleaned sum
    assert second.held is None
    assert not late.on
    assert len(kept) == WARMUP


def test_held_batches_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch):
    """A publisher thread that stalls keeps at most about HELD_MAX_BYTES of batches alive for their probes."""
    monkeypatch.setattr(late_probes, "HELD_MAX_BYTES", 4 * ROWS * WIDTH * 4)
    late = LateProbes()
    kept = _after_warmup(late)
    infos = [BatchInfo((torch.zeros(ROWS, WIDTH),), late) for _ in range(6)]
    assert [i.held is not None for i in infos] == [True] * 4 + [False] * 2
    assert infos[0].probe() == 0.0  # probed: its place is free again
    assert BatchInfo((torch.zeros(ROWS, WIDTH),), late).held is not None
    assert len(kept) == WARMUP


def test_one_tensor_given_twice_in_a_batch_is_not_taken_for_reused_memory():
    """An autoencoder's batch (x, x): one tensor at one address, twice, in one batch."""
    late = LateProbes()
    kept = _after_warmup(late)
    x = torch.zeros(ROWS, WIDTH)
    info = BatchInfo((x, x), late)
    assert info.held == [x, x]
    assert late.on
    assert info.probe() == 0.0
    assert len(kept) == WARMUP


def test_a_step_whose_folded_micro_batch_was_overwritten_before_its_probe_has_no_batch_finiteness():
    late = LateProbes()
    kept = _after_warmup(late)
    shared = torch.zeros(ROWS, WIDTH)
    s = StepState(0, 0.0)
    s.batch = BatchInfo((torch.zeros(ROWS, WIDTH),), late)
    s.folded.append(BatchInfo((shared,), late))
    BatchInfo((shared,), late)  # the loader's next batch, written where the folded one was
    assert s.build()["finite"]["batch"] is None
    assert len(kept) == WARMUP
