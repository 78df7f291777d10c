"""A loop that marks no steps: ``Watch(model, opt)`` and a loop that draws its batches itself, neither
``watch.batches()`` nor ``watch.step()``.

Written after such a loop (a DataLoader iterated directly, a list of batches, a generator) had one step record for
the whole run: twenty updates in step 0, its loss the last one logged, and nothing said. Now a training forward after
an update opens the next step.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tuiwatch.publisher.watch import Watch

from ..helpers import watch_steps

UNMARKED = "the loop marks no steps"


def _loader(batches: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(batches * 8, 4, generator=g), torch.randint(0, 3, (batches * 8,), generator=g))
    return DataLoader(data, batch_size=8)


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_loop_over_its_own_loader_logging_after_the_update_gets_a_step_per_update(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    model, opt = _model()
    watch = Watch(model, opt, run_dir=run_root, name="unmarked", system=False, quiet=True)
    losses = []
    for i, (x, y) in enumerate(_loader(20)):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch.log(loss=loss.item())  # after the update: still this step's, not the next one's
        losses.append(loss.item())
        if i % 5 == 4:
            with torch.no_grad():  # an evaluation between updates opens no step
                model(x)
    watch.close()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == list(range(20))
    assert [s["opt_step"] for s in steps] == list(range(1, 21))
    assert [s["loss"] for s in steps] == losses
    assert all(s["data_wait_s"] is None for s in steps)  # not measured, never 0
    # The step opens before its forward: the forward phase is the forward's, within the step's time (a step with the
    # evaluation's forward too has two, and no phases).
    phased = [s for s in steps[1:] if s["step"] % 5 != 4]
    assert all(s["forward_s"] is not None and 0 <= s["forward_s"] <= s["compute_s"] for s in phased)
    lines = [line for line in capsys.readouterr().err.splitlines() if UNMARKED in line]
    assert len(lines) == 1
    assert "watch.batches(loader)" in lines[0]


def test_gradient_accumulation_without_marks_is_a_step_per_update(run_root: Path):
    model, opt = _model()
    watch = Watch(model, opt, run_dir=run_root, name="accumulating", system=False, quiet=True)
    per_update = []
    for i, (x, y) in enumerate(_loader(24)):
        loss = nn.functional.cross_entropy(model(x), y) / 4
        loss.backward()
        watch.log(loss=loss)
        if i % 4 == 3:
            opt.step()
            opt.zero_grad()
            per_update.append(loss.item())
    watch.close()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 7))
    assert [s["loss"] for s in steps] == pytest.approx(per_update)  # each step's last micro-batch's


def test_a_loop_that_marks_its_steps_at_the_bottom_is_left_as_it_marks_them(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    model, opt = _model()
    watch = Watch(model, opt, run_dir=run_root, name="marked", system=False, quiet=True)
    batches = list(_loader(10))
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch.step()  # the boundary after this update: the loop's first comes after its first update
    watch.close()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 11))
    assert all(type(s["loss"]) is float for s in steps)
    assert UNMARKED not in capsys.readouterr().err
    assert not any(len(m._forward_pre_hooks) for m in model.modules())  # its hook came off at the second step


def test_a_model_called_by_its_parts_without_marks_gets_a_step_per_update(run_root: Path):
    class ActorCritic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.actor = nn.Linear(4, 3)
            self.critic = nn.Linear(4, 1)

    torch.manual_seed(0)
    agent = ActorCritic()
    opt = torch.optim.SGD(agent.parameters(), lr=0.01)
    watch = Watch(agent, opt, run_dir=run_root, name="parts", system=False, quiet=True)
    for x, y in _loader(12):
        loss = nn.functional.cross_entropy(agent.actor(x), y) + agent.critic(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch.log(loss=loss)
    watch.close()
    steps = watch_steps(watch)
    # A model without a forward of its own is watched by its parts from the start: the first part's forward after an
    # update opens the next step, the second part's is in it.
    assert [s["opt_step"] for s in steps] == list(range(1, 13))
    assert all(s["finite"]["forward"] for s in steps[1:])


def test_a_model_with_a_forward_whose_parts_the_loop_calls_without_marks_gets_a_step_per_update(run_root: Path):
    # Its forward is never called (the loop calls model.encoder and model.head itself): its first two updates were one
    # step, because its parts were watched only from the second optimizer step on.
    class EncoderHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
            self.head = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.head(self.encoder(x))
            return out

    torch.manual_seed(0)
    model = EncoderHead()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, opt, run_dir=run_root, name="own-forward", system=False, quiet=True)
    losses = []
    for x, y in _loader(8):
        loss = nn.functional.cross_entropy(model.head(model.encoder(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch.log(loss=loss.item())
        losses.append(loss.item())
    watch.close()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == list(range(8))
    assert [s["opt_step"] for s in steps] == list(range(1, 9))
    assert [s["loss"] for s in steps] == losses
    assert all(s["finite"]["forward"] for s in steps[1:])  # its parts' outputs checked from the second step


@pytest.mark.parametrize("marks", [False, True])
def test_several_optimizers_without_marks_are_told_to_mark_their_steps(
    run_root: Path, capsys: pytest.CaptureFixture[str], marks: bool
):
    class Gan(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator = nn.Linear(2, 4)
            self.discriminator = nn.Linear(4, 1)

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.generator(z)
            return out

    torch.manual_seed(0)
    gan = Gan()
    d_opt = torch.optim.SGD(gan.discriminator.parameters(), lr=0.01)
    g_opt = torch.optim.SGD(gan.generator.parameters(), lr=0.01)
    watch = Watch(gan, [d_opt, g_opt], run_dir=run_root, name="gan", system=False, quiet=True)
    for _ in range(6):
        z, real = torch.randn(8, 2), torch.randn(8, 4)
        d_loss = gan.discriminator(gan(z).detach()).mean() - gan.discriminator(real).mean()
        d_opt.zero_grad()
        d_loss.backward()
        d_opt.step()
        g_loss = -gan.discriminator(gan(z)).mean()  # the generator's forward, after the discriminator's update
        g_opt.zero_grad()
        g_loss.backward()
        g_opt.step()
        if marks:
            watch.step()
    watch.close()
    said = [line for line in capsys.readouterr().err.splitlines() if UNMARKED in line]
    if marks:
        assert said == []
        assert len(watch_steps(watch)) == 6
    else:
        assert len(said) == 1
        assert "call watch.step() where each step begins" in said[0]


@pytest.mark.parametrize("marks", [False, True])
def test_a_loop_without_an_optimizer_or_marks_gets_a_step_per_backward(
    run_root: Path, capsys: pytest.CaptureFixture[str], marks: bool
):
    # word_language_model's loop without --use-optimizer: the gradients zeroed to None at the top, a clip, the update
    # by hand (p.data.add_(p.grad, alpha=-lr)). With no optimizer to hook, its update was told only where a step
    # ended, when the gradients were already gone: an unmarked run had no step record at all. Now the end of each
    # backward through the model's output tells it, with its pre-clip norm.
    model, _ = _model()
    watch = Watch(model, run_dir=run_root, name="manual", system=False, quiet=True)
    losses, norms, params = [], [], []
    for i, (x, y) in enumerate(_loader(5)):
        model.zero_grad()  # to None, before the forward that opens the step
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
        for p in model.parameters():
            assert p.grad is not None
            p.data.add_(p.grad, alpha=-0.1)
        losses.append(loss.item())
        params.append(float(torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in model.parameters()]))))
        if i == 2:
            with torch.no_grad():  # an evaluation between updates opens no step
                model(x)
            # nor does a gradient taken with torch.autograd.grad (no .grad of the model's is made)
            torch.autograd.grad(model(x).sum(), list(model.parameters()))
        if marks:
            watch.step()
    watch.close()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4, 5]
    assert [s["loss"] for s in steps] == pytest.approx(losses)
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms)  # before the clip (0.05 clipped them all)
    assert all(s["grad_norm_clipped"] for s in steps)
    assert steps[0]["param_norm"] == pytest.approx(params[0], rel=1e-5)  # after the update by hand
    assert steps[0]["update_norm"] > 0
    said = capsys.readouterr().err.splitlines()
    told = [line for line in said if "the loop marks no steps" in line]
    assert len(told) == (0 if marks else 1)
    assert all("after a backward" in line for line in told)
    assert not [line for line in said if "the loop marked no steps" in line]


class ReturnsItsLoss(nn.Module):
    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {self.key: nn.functional.cross_entropy(self.model(x), y)}


@pytest.mark.parametrize("key", ["loss", "loss_cls"])
def test_a_loop_without_an_optimizer_whose_model_returns_its_loss_alone_gets_a_step_per_backward(
    run_root: Path, key: str
):
    # The backward was told through the model's output tensor, which a model that returns its loss alone (MMEngine's
    # shape) does not have: no step at all. Told through the loss now.
    inner, _ = _model()
    model = ReturnsItsLoss(inner, key)
    watch = Watch(model, run_dir=run_root, name="manual", system=False, quiet=True)
    losses = []
    for x, y in _loader(4):
        model.zero_grad()
        loss = model(x, y)[key]
        watch.log(loss=loss)
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            p.data.add_(p.grad, alpha=-0.1)
        losses.append(loss.item())
    watch.close()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4]
    assert [s["loss"] for s in steps] == pytest.approx(losses)


def test_a_loop_without_an_optimizer_or_marks_whose_backwards_are_not_seen_is_told_at_its_end(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    # A loss the loop makes without the model's output (a loss of the parameters alone): no backward through the
    # output tells an update, so the run is one step, and it is told so rather than left to find none.
    model, _ = _model()
    watch = Watch(model, run_dir=run_root, name="manual", system=False, quiet=True)
    for x, _y in _loader(5):
        model.zero_grad()
        model(x)
        torch.stack([p.square().sum() for p in model.parameters()]).sum().backward()
        for p in model.parameters():
            assert p.grad is not None
            p.data.add_(p.grad, alpha=-0.1)
    watch.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "the loop marked no steps" in line]
    assert len(said) == 1
    assert "call watch.step() where each step begins" in said[0]
    assert watch_steps(watch) == []


def test_an_evaluation_after_an_epoch_is_not_the_compute_of_its_last_step(run_root: Path):
    # word_language_model evaluates after each epoch, and on the test set after the last: in a loop that marks no
    # steps the epoch's last step ends at the next training forward (or close()), and its compute_s held the whole
    # evaluation (27.8 s for a 0.5 s step).
    model, opt = _model()
    watch = Watch(model, opt, run_dir=run_root, name="unmarked", system=False, quiet=True)
    bounds = []
    for _epoch in range(2):
        for x, y in _loader(3):
            began = time.perf_counter()  # before the training forward that opens the step
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            model(x)
            first_evaluated = time.perf_counter()  # after the evaluation's first forward
            for _ in range(200):
                model(x)
        model.train()
        watch.log(val_loss=1.0)  # the evaluation's result: still the epoch's last step's
        bounds.append(first_evaluated - began)
    watch.close()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    for last, bound in zip((steps[2], steps[5]), bounds, strict=True):
        assert last["val_loss"] == 1.0
        assert 0 < last["compute_s"] <= bound  # up to the evaluation's first forward at the latest


@pytest.mark.parametrize("by_hand", [False, True])
def test_a_model_trained_in_eval_mode_without_marks_gets_a_step_per_update(run_root: Path, by_hand: bool):
    # Fine-tuning with frozen BatchNorm statistics: model.eval() for the whole run. Its forwards with gradients are
    # its training's; until 2026-12-06 none opened a step, and ten updates were one step.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.eval()
    watch = Watch(model, None if by_hand else opt, run_dir=run_root, name="frozen-bn", system=False, quiet=True)
    losses = []
    for x, y in _loader(10):
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        opt.zero_grad()
        loss.backward()
        opt.step()  # (without the optimizer watched: an update by hand, as far as the Watch knows)
        losses.append(loss.item())
        with torch.no_grad():  # an evaluation between updates is still one
            model(x)
    watch.close()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 11))
    assert [s["loss"] for s in steps] == pytest.approx(losses)
    assert {s["training"] for s in steps} == {False}
