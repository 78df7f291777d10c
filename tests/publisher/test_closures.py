"""``optimizer.step(closure)`` with the three lines: the step's gradients are the ones its closure makes.

torch runs the step pre-hook before the closure, so the gradients there are
the previous step's (or none at the first): the norm would lag a step behind
and ``on_nonfinite`` would check the last step's gradients while this step's
NaN is applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import tuiwatch
from tuiwatch.publisher.watch import Watch

from ..helpers import watch_steps


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _closure(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, first_norms: list[float]
) -> Callable[[], torch.Tensor]:
    calls = 0

    def closure() -> torch.Tensor:
        nonlocal calls
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        if calls == 0:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            first_norms.append(math.sqrt(sum(float(g.pow(2).sum()) for g in grads)))
        calls += 1
        return loss

    return closure


def test_lbfgs_gradient_norm_is_the_first_evaluations_of_each_step(run_root: Path, socket_dir: Path):
    model = _model()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    first_norms: list[float] = []
    moves: list[float] = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(4):
            watch.step()
            before = _weights(model)
            watch.log(loss=optimizer.step(_closure(model, optimizer, x, first_norms)))
            moves.append(
                math.sqrt(sum(float((p - b).pow(2).sum()) for p, b in zip(_weights(model), before, strict=True)))
            )
    steps = watch_steps(watch)
    assert [s["grad_norm"] for s in steps] == pytest.approx(first_norms, rel=1e-6)
    assert len(set(first_norms)) == 4  # each step's own, none carried over
    assert steps[0]["update_norm"] == pytest.approx(moves[0], rel=1e-5)  # the whole step's, all evaluations


def _nan_at(
    step: int, model: nn.Module, optimizer: torch.optim.Optimizer
) -> Callable[[int], Callable[[], torch.Tensor]]:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))

    def closure_for(i: int) -> Callable[[], torch.Tensor]:
        batch = x.clone()
        if i == step:
            batch[0, 0] = float("nan")  # this step's forward, inside the closure, makes the NaN
        return _closure(model, optimizer, batch, [])

    return closure_for


def test_stop_raises_inside_the_closure_before_the_bad_update(run_root: Path, socket_dir: Path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    closure_for = _nan_at(2, model, optimizer)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(tuiwatch.NonFiniteError) as info:
        for i in range(4):
            watch.step()
            before = _weights(model)
            optimizer.step(closure_for(i))
    assert info.value.step == 2
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))  # not applied
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert [s["step"] for s in watch_steps(watch)] == [0, 1, 2]


def test_skip_leaves_the_weights_of_a_bad_closure_step_and_goes_on(run_root: Path, socket_dir: Path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    closure_for = _nan_at(1, model, optimizer)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, on_nonfinite="skip") as watch:
        for i in range(3):
            watch.step()
            before = _weights(model)
            optimizer.step(closure_for(i))
            unchanged = all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
            assert unchanged == (i == 1)
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert [s["finite"]["grad"] for s in steps] == [True, False, True]
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
