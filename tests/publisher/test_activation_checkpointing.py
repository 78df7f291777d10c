"""Activation checkpointing (``torch.utils.checkpoint``): the forward it runs again in the backward is not the step's.

Written after a loop that checkpoints its model, or a part of it, had the recomputation counted as a second forward:
no phases on any step, a part's width for the class count (48 for a 4-class head: loss-chance blind), and a loop
that marks no steps opened each step in the backward, so each step held the next update's loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tuiwatch.publisher.activation_checkpointing import in_backward, in_function_forward
from tuiwatch.publisher.watch import Watch

from ..helpers import watch_steps


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU())
        self.head = nn.Linear(48, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        x = torch.randn(16, 8, generator=g)
        out.append((x, x[:, :4].argmax(1)))
    return out


def _train(run_root: Path, *, reentrant: bool, marked: bool, parts: bool, steps: int = 12) -> tuple[Watch, list[float]]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    watch = Watch(model, opt, run_dir=run_root, name="checkpointed", system=False, quiet=True)
    losses = []
    batches = _batches(steps)
    for x, y in watch.batches(batches) if marked else batches:
        if reentrant:
            x = x.requires_grad_()  # a reentrant checkpoint gives the parameters no gradient unless an input needs one
        if parts:  # the loop calls the parts, the encoder checkpointed
            out = model.head(checkpoint(model.encoder, x, use_reentrant=reentrant))
        else:
            out = checkpoint(model, x, use_reentrant=reentrant)
        loss = nn.functional.cross_entropy(out, y)
        watch.log(loss=loss)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    watch.close()
    return watch, losses


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_a_checkpointed_model_has_one_forward_a_step_and_its_phases(run_root: Path, reentrant: bool):
    watch, losses = _train(run_root, reentrant=reentrant, marked=True, parts=False)
    steps = watch_steps(watch)
    assert [s["loss"] for s in steps] == pytest.approx(losses)
    for s in steps:
        assert s["forward_s"] is not None, s["step"]
        assert 0 <= s["forward_s"] <= s["compute_s"]
        assert s["finite"]["forward"] is True
    assert [s["classes"] for s in steps if "classes" in s] == [4]


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_a_checkpointed_part_is_not_taken_for_the_head(run_root: Path, reentrant: bool):
    watch, _ = _train(run_root, reentrant=reentrant, marked=True, parts=True)
    steps = watch_steps(watch)
    # The parts are watched from the second optimizer step (the model's own forward ran in neither of the first two).
    assert [s["classes"] for s in steps if "classes" in s] == [4]  # the head's classes, not the encoder's width
    assert all(s["forward_s"] is not None for s in steps[2:])


def test_a_loop_that_marks_no_steps_and_checkpoints_its_model_logs_each_loss_in_its_own_step(run_root: Path):
    watch, losses = _train(run_root, reentrant=True, marked=False, parts=False)
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 13))
    assert [s["loss"] for s in steps] == pytest.approx(losses)
    assert all(s["forward_s"] is not None for s in steps[1:])


def test_an_evaluation_without_gradients_is_not_taken_for_a_checkpoints_first_run():
    x = torch.randn(2, 3)
    needs = torch.randn(2, 3, requires_grad=True)
    assert not in_backward()
    with torch.no_grad():
        assert not in_function_forward((needs,))  # no_grad leaves forward-mode gradients on
    with torch.inference_mode():
        assert not in_function_forward((x,))
    seen: list[tuple[bool, bool]] = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, t: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            seen.append((in_function_forward((t,)), in_backward()))
            return t * 2

        @staticmethod
        def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            seen.append((False, in_backward()))
            return g * 2

    Probe.apply(needs).sum().backward()
    assert seen == [(True, False), (False, True)]
