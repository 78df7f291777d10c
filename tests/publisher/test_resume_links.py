"""Resume as nanoGPT does it (issue 14, item 9): a prefetched batch, the loop's own state, one run across two ledgers.

A checkpoint is requested over the real socket at step 5 of a char-LM loop
that prefetches its next batch; a second Watch resumes from it with
``resume_from=``. The loop keeps the prefetched batch and its best eval loss
in ``watch.extra_state``, so the resumed run is bit-identical; ``report`` and
``diff`` treat the two ledgers as one run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuiwatch.analysis.diff import as_text as diff_text
from tuiwatch.analysis.diff import compare
from tuiwatch.analysis.report import as_text, summarize
from tuiwatch.ledger.chain import read_run, resumed_from
from tuiwatch.ledger.records import Record
from tuiwatch.publisher.checkpoints import CheckpointError
from tuiwatch.publisher.watch import Watch
from tuiwatch.wire.protocol import command_line, connect

from ..helpers import records, wait_until

STEPS, CHECKPOINT_AT = 12, 5
DATA = torch.arange(400) % 23


class Bigram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(23, 23)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.table(idx)
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(DATA) - 9, (4,))  # the global RNG, as nanoGPT draws it
    return torch.stack([DATA[i : i + 8] for i in ix]), torch.stack([DATA[i + 1 : i + 9] for i in ix])


def train(run_root: Path, resume: str | None = None) -> tuple[Watch, dict[int, float], str | None]:
    """nanoGPT's loop shape; returns the Watch, the loss per step, and the checkpoint it took (if asked)."""
    torch.manual_seed(0)
    model = Bigram()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, resume_from=resume)
    state: dict[str, Any] = {"best_val_loss": math.inf}
    if resume is None:
        X, Y = get_batch()  # the prefetch before the loop
    else:
        saved = watch.extra_state  # what the checkpoint held of it
        X, Y, state = saved["X"], saved["Y"], {"best_val_loss": saved["best_val_loss"]}
    # Called at the checkpoint's boundary: the batch already fetched for the coming step goes with it.
    watch.extra_state = lambda: {"X": X, "Y": Y, "best_val_loss": state["best_val_loss"]}
    losses: dict[int, float] = {}
    checkpoint = None
    sock = None
    for _ in range(watch.steps, STEPS):
        if resume is None and watch.steps == CHECKPOINT_AT:
            assert watch.socket_path is not None
            sock = connect(watch.socket_path)
            sock.sendall(command_line("checkpoint", 1))
            wait_until(lambda: watch._commands.pending() or None, what="the checkpoint command to arrive")
        watch.step(batch=(X, Y))
        _, loss = model(X, Y)
        losses[watch.steps - 1] = loss.item()
        watch.log(loss=loss)
        X, Y = get_batch()  # nanoGPT fetches the next batch during this step
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if watch.steps % 4 == 0:
            state["best_val_loss"] = min(state["best_val_loss"], loss.item())
    watch.close()
    if sock is not None:
        sock.close()
    assert watch.ledger_path is not None
    actions = [r for r in records(watch.ledger_path) if r["kind"] == "action"]
    if actions:
        assert actions[0]["ok"], actions[0]
        checkpoint = actions[0]["path"]
    return watch, losses, checkpoint


@pytest.fixture
def runs(run_root: Path) -> Iterator[tuple[Watch, dict[int, float], Watch, dict[int, float], str]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, losses_a, checkpoint = train(run_root / "a")
        assert checkpoint is not None
        b, losses_b, _ = train(run_root / "b", resume=checkpoint)
        yield a, losses_a, b, losses_b, checkpoint
    finally:
        torch.set_num_threads(threads)


def _ledger(watch: Watch) -> list[Record]:
    assert watch.ledger_path is not None
    return records(watch.ledger_path)


def test_a_resumed_prefetching_loop_continues_bit_identically(runs: Any):
    _a, losses_a, _b, losses_b, _ = runs
    assert sorted(losses_b) == list(range(CHECKPOINT_AT, STEPS))
    assert losses_b == {s: losses_a[s] for s in range(CHECKPOINT_AT, STEPS)}


def test_the_resumed_run_names_its_checkpoint_and_the_run_that_wrote_it(runs: Any):
    a, _, b, _, checkpoint = runs
    run_b = _ledger(b)[0]
    link = run_b["resumed_from"]
    assert link["checkpoint"] == checkpoint
    assert link["step"] == CHECKPOINT_AT
    assert link["run_id"] == _ledger(a)[0]["run_id"]
    assert link["ledger"] == str(a.ledger_path)
    assert resumed_from(_ledger(b)) == link


def test_report_reads_the_two_ledgers_as_one_run(runs: Any):
    a, _, b, _, checkpoint = runs
    chain = read_run(b.run_dir)
    assert [r["step"] for r in chain.records if r["kind"] == "step"] == list(range(STEPS))
    text = as_text(summarize(chain.records, chain.skipped, chain))
    assert f"steps      {STEPS} in" in text
    assert f"resumed    at step {CHECKPOINT_AT} from {checkpoint}; the steps before it are from {a.ledger_path}" in text


def test_report_says_when_the_earlier_ledger_is_gone(runs: Any):
    a, _, b, _, _ = runs
    a.ledger_path.unlink()
    chain = read_run(b.run_dir)
    text = as_text(summarize(chain.records, chain.skipped, chain))
    assert f"steps      {STEPS - CHECKPOINT_AT} in" in text
    assert f"the steps before it are not here ({a.ledger_path}: no ledger at" in text


def test_diff_compares_the_common_steps_of_a_resumed_run(runs: Any):
    a, _, b, _, _ = runs
    found = compare(_ledger(a), _ledger(b))
    assert found.identical
    assert found.common == list(range(CHECKPOINT_AT, STEPS))
    text = diff_text(found, ["batch_ids", "loss", "grad_norm", "lr", "param_norm"])
    assert text.splitlines()[0] == (
        f"steps      A has {STEPS}, B has {STEPS - CHECKPOINT_AT}; {STEPS - CHECKPOINT_AT} in common "
        f"({CHECKPOINT_AT}-{STEPS - 1}) are compared "
        f"(B resumed from the other run's checkpoint at step {CHECKPOINT_AT})"
    )
    assert "identical: the 7 common steps agree on loss, grad_norm, lr, param_norm" in text
    assert "not recorded by either run, so not compared: batch_ids" in text


def test_extra_state_that_a_checkpoint_cannot_hold_is_refused_with_the_reason(run_root: Path):
    model = nn.Linear(2, 2)
    with Watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=run_root, system=False) as watch:
        watch.extra_state = {"cursor": 3, "sampler": object()}
        with pytest.raises(CheckpointError, match=r"watch\.extra_state holds a object: a checkpoint keeps numbers"):
            watch.checkpoint_state()


def test_restore_after_the_watch_links_the_run_with_a_resumed_record(runs: Any, run_root: Path):
    _a, _, _b, _, checkpoint = runs
    torch.manual_seed(0)
    model = Bigram()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root / "c", system=False, quiet=True) as watch:
        ckpt = watch.restore(checkpoint)
        assert watch.extra_state is not None
        assert watch.extra_state["best_val_loss"] == ckpt.extra["best_val_loss"]
    ledger = _ledger(watch)
    assert [r["kind"] for r in ledger if r["kind"] != "publisher"] == ["run", "resumed", "end"]
    assert ledger[0]["resumed_from"] is None
    link = resumed_from(ledger)
    assert link is not None
    assert (link["checkpoint"], link["step"]) == (checkpoint, CHECKPOINT_AT)
