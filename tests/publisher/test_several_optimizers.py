"""Several optimizers stepping one model: torch's ``Muon`` for the matrices beside ``AdamW`` for the rest (the way
torch documents Muon), given to one Watch as a list.

With the first optimizer alone watched, the step's lr was AdamW's, its update norm covered AdamW's parameters only
(the biases: 0.006 where the model moved 0.12), and a checkpoint held AdamW's state only, so a resume was not exact.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuiwatch.errors import NonFiniteError, TuiwatchError
from tuiwatch.publisher.checkpoints import load_checkpoint
from tuiwatch.publisher.watch import Watch

from ..helpers import records, watch_steps

X = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
Y = X[:, :4].argmax(1)


def _model_and_optimizers() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    matrices = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim != 2]
    return model, torch.optim.AdamW(rest, lr=1e-3), torch.optim.Muon(matrices, lr=0.02)


def _distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float((x - y).pow(2).sum()) for x, y in zip(a, b, strict=True)))


def _norm(model: nn.Module) -> float:
    return math.sqrt(sum(float(p.detach().pow(2).sum()) for p in model.parameters()))


def _step(
    model: nn.Module, optimizers: list[torch.optim.Optimizer], x: torch.Tensor = X, y: torch.Tensor = Y
) -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    for o in optimizers:
        o.step()
    for o in optimizers:
        o.zero_grad()
    return loss


def test_muon_beside_adamw_records_the_whole_models_update_both_lrs_and_one_optimizer_step(run_root: Path):
    model, adamw, muon = _model_and_optimizers()
    updates, norms, biases = [], [], []
    options: dict[str, Any] = {
        "run_dir": run_root,
        "system": False,
        "quiet": True,
        "update_norm_every": 1,
        "param_norm_every": 1,
    }
    with Watch(model, [adamw, muon], **options) as watch:
        for _ in range(12):
            watch.step()
            before = [p.detach().clone() for p in model.parameters()]
            watch.log(loss=_step(model, [adamw, muon]))
            after = [p.detach() for p in model.parameters()]
            updates.append(_distance(before, after))
            biases.append(_distance(before[1::2], after[1::2]))
            norms.append(_norm(model))
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 13))
    assert all(s["lr"] == [1e-3, 0.02] for s in steps)
    assert [s["update_norm"] for s in steps] == pytest.approx(updates, rel=1e-5)
    assert [s["param_norm"] for s in steps] == pytest.approx(norms, rel=1e-6)
    assert all(s["optimizer_s"] > 0 for s in steps)  # from the first optimizer's step to the last one's end
    assert min(updates) > 10 * max(biases)  # Muon's update is most of it: AdamW's alone is what was recorded before
    assert watch.ledger_path is not None
    assert records(watch.ledger_path, "run")[0]["optimizer"] == "AdamW + Muon"
    assert [a["rule"] for a in records(watch.ledger_path, "alert") if a["severity"] != "info"] == []


def test_an_optimizer_that_steps_every_other_step_is_in_the_update_of_the_steps_it_stepped(run_root: Path):
    # A GAN's or a slow head's second optimizer: the update norm is what every optimizer of the step moved, and a
    # step counts once as an optimizer step whichever of them stepped.
    model, adamw, muon = _model_and_optimizers()
    updates = []
    with Watch(model, (adamw, muon), run_dir=run_root, system=False, quiet=True, update_norm_every=1) as watch:
        for step in range(8):
            watch.step()
            before = [p.detach().clone() for p in model.parameters()]
            stepping = [adamw, muon] if step % 2 else [muon]
            watch.log(loss=_step(model, stepping))
            updates.append(_distance(before, [p.detach() for p in model.parameters()]))
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 9))
    assert [s["update_norm"] for s in steps] == pytest.approx(updates, rel=1e-5)


def test_skip_on_a_nonfinite_gradient_skips_every_optimizer_of_the_step(run_root: Path):
    model, adamw, muon = _model_and_optimizers()
    bad = X.clone()
    bad[3, 0] = float("nan")
    with Watch(model, [adamw, muon], run_dir=run_root, system=False, quiet=True, on_nonfinite="skip") as watch:
        for step in range(6):
            watch.step()
            before = [p.detach().clone() for p in model.parameters()]
            _step(model, [adamw, muon], bad if step == 3 else X)
            moved = _distance(before, [p.detach() for p in model.parameters()])
            assert (moved == 0.0) == (step == 3), (step, moved)
    steps = watch_steps(watch)
    assert [s.get("opt_skipped", False) for s in steps] == [False, False, False, True, False, False]
    assert [s["opt_step"] for s in steps] == [1, 2, 3, None, 4, 5]


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.discriminator = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))


def _gan_steps(watch: Watch, gan: GAN, opt_d: torch.optim.Optimizer, opt_g: torch.optim.Optimizer, late: bool) -> None:
    """dcgan's step, the discriminator's update then the generator's, each after a backward of its own; the
    generator's loss is NaN at step 3. ``late``: Lightning's order, gradients_ready() before each optimizer."""
    bce = nn.functional.binary_cross_entropy_with_logits
    for step in range(6):
        watch.step()
        real, fake = torch.randn(16, 8), gan.generator(torch.randn(16, 4))
        d_loss = bce(gan.discriminator(real), torch.ones(16, 1)) + bce(
            gan.discriminator(fake.detach()), torch.zeros(16, 1)
        )
        opt_d.zero_grad()
        d_loss.backward()
        if late:
            watch.gradients_ready()
        opt_d.step()
        g_loss = bce(gan.discriminator(fake), torch.ones(16, 1)) * (math.nan if step == 3 else 1.0)
        opt_g.zero_grad()
        g_loss.backward()
        if late:
            watch.gradients_ready()
        opt_g.step()


@pytest.mark.parametrize("late", [False, True], ids=["hooks", "gradients_ready"])
def test_a_later_optimizers_own_nonfinite_gradients_stop_the_run_before_its_update(run_root: Path, late: bool):
    # The step's check was the first optimizer's alone: the generator's NaN gradients were applied, and the run
    # went on with NaN weights, to be named at a later step's forward.
    torch.manual_seed(0)
    gan = GAN()
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=2e-4)
    watch = Watch(gan, [opt_d, opt_g], run_dir=run_root, system=False, quiet=True, late_gradients=late)
    with pytest.raises(NonFiniteError) as stopped:
        _gan_steps(watch, gan, opt_d, opt_g, late)
    assert (stopped.value.step, stopped.value.boundary) == (3, "grad")
    assert all(bool(p.isfinite().all()) for p in gan.parameters())  # the generator's update was not taken
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert steps[3]["grad_norm"] is None or math.isnan(steps[3]["grad_norm"])


def test_with_skip_a_later_optimizers_nonfinite_gradients_skip_its_update_alone(run_root: Path):
    torch.manual_seed(0)
    gan = GAN()
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=2e-4)
    with Watch(gan, [opt_d, opt_g], run_dir=run_root, system=False, quiet=True, on_nonfinite="skip") as watch:
        _gan_steps(watch, gan, opt_d, opt_g, late=False)
    assert all(bool(p.isfinite().all()) for p in gan.parameters())
    steps = watch_steps(watch)
    assert [s.get("opt_skipped", False) for s in steps] == [False, False, False, True, False, False]
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4, 5, 6]  # the discriminator stepped at step 3


def test_a_checkpoint_holds_every_optimizer_and_scheduler_and_resumes_exactly(run_root: Path, tmp_path: Path):
    def run(name: str, steps: int, resume_from: Path | None = None, save_at: int | None = None) -> list[float]:
        model, adamw, muon = _model_and_optimizers()
        schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5) for o in (adamw, muon)]
        losses = []
        options: dict[str, Any] = {
            "run_dir": run_root / name,
            "system": False,
            "quiet": True,
            "resume_from": resume_from,
        }
        with Watch(model, [adamw, muon], scheduler=schedulers, **options) as watch:
            for step in range(watch._tracker.step, steps):
                if step == save_at:
                    torch.save(watch.checkpoint_state(), tmp_path / "ckpt.pt")
                watch.step()
                losses.append(_step(model, [adamw, muon]).item())
                for scheduler in schedulers:
                    scheduler.step()
        return losses

    straight = run("a", 10, save_at=5)
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert isinstance(ckpt.optimizer, list)
    assert isinstance(ckpt.scheduler, list)
    # AdamW's moments of the two biases, Muon's momentum of the two matrices
    assert [sorted(state["state"][0]) for state in ckpt.optimizer] == [
        ["exp_avg", "exp_avg_sq", "step"],
        ["momentum_buffer"],
    ]
    assert [len(state["state"]) for state in ckpt.optimizer] == [2, 2]
    assert [state["last_epoch"] for state in ckpt.scheduler] == [5, 5]
    assert run("b", 10, resume_from=tmp_path / "ckpt.pt") == straight[5:]


def test_a_checkpoint_of_another_set_of_optimizers_is_refused_before_anything_is_loaded(run_root: Path, tmp_path: Path):
    model, adamw, muon = _model_and_optimizers()
    with Watch(model, [adamw, muon], run_dir=run_root / "a", system=False, quiet=True) as watch:
        watch.step()
        _step(model, [adamw, muon])
        torch.save(watch.checkpoint_state(), tmp_path / "two.pt")
    _step(model, [adamw, muon])  # the weights move on from the checkpoint's
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TuiwatchError) as refused:
        Watch(model, adamw, run_dir=run_root / "b", system=False, quiet=True, resume_from=tmp_path / "two.pt")
    assert str(refused.value) == (
        "the checkpoint has 2 optimizer state(s) and the Watch was given 1: give Watch(..., optimizer=...) the same "
        "optimizers, in the same order, as the run that wrote it"
    )
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    # A list of one and the one alone are the same: a checkpoint of adamw resumes into Watch(model, [adamw]).
    with Watch(model, adamw, run_dir=run_root / "c", system=False, quiet=True) as watch:
        torch.save(watch.checkpoint_state(), tmp_path / "one.pt")
    saved = adamw.state_dict()["state"][0]["exp_avg"].clone()
    _step(model, [adamw, muon])
    assert not torch.equal(adamw.state_dict()["state"][0]["exp_avg"], saved)
    with Watch(model, [adamw], run_dir=run_root / "d", system=False, quiet=True, resume_from=tmp_path / "one.pt"):
        assert torch.equal(adamw.state_dict()["state"][0]["exp_avg"], saved)


def test_a_watch_given_one_of_two_optimizers_says_so_once_and_one_given_both_says_nothing(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    model, adamw, muon = _model_and_optimizers()
    for name, given in (("one", muon), ("both", [adamw, muon])):
        with Watch(model, given, name=name, run_dir=run_root, system=False, quiet=True) as watch:
            for _ in range(3):
                watch.step()
                _step(model, [adamw, muon])
    assert capsys.readouterr().err.splitlines() == [
        "tuiwatch: one: 2 of the model's parameters that the optimizer does not hold were updated in step 0 (another "
        "optimizer?): its lr, update norm and checkpoints leave them out; give the Watch every optimizer, "
        "Watch(model, [muon, adamw])"
    ]
    # Trainable parameters the optimizer leaves alone (a head trained over a backbone not frozen) are no sign.
    head = torch.optim.SGD(list(model.parameters())[2:], lr=0.1)
    with Watch(model, head, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            watch.step()
            _step(model, [head])
    assert capsys.readouterr().err == ""


def test_a_target_network_synced_inside_the_model_is_not_taken_for_another_optimizer(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    # Lightning's DQN example: its module holds the Q-network and its target, the optimizer only the first, and
    # training_step syncs the target with load_state_dict at step 0. Its 2 parameters moved, with no gradient.
    class DQN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 2)
            self.target_net = nn.Linear(8, 2)

    torch.manual_seed(0)
    model = DQN()
    opt = torch.optim.Adam(model.net.parameters(), lr=0.01)
    with Watch(model, opt, name="dqn", run_dir=run_root, system=False, quiet=True) as watch:
        for i in range(3):
            watch.step()
            if i == 0:
                model.target_net.load_state_dict(model.net.state_dict())
            with torch.no_grad():
                target = model.target_net(X).max(1)[0]
            loss = nn.functional.mse_loss(model.net(X).max(1)[0], target + 1)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert capsys.readouterr().err == ""


class PlainSGD:
    """An optimizer written by hand that is no torch.optim.Optimizer (a course's): param_groups and step()."""

    def __init__(self, params: Any, lr: float = 0.1) -> None:
        self.lr = lr
        self.params: list[torch.Tensor] = list(params)
        self.param_groups = [{"params": self.params, "lr": lr}]

    def step(self) -> None:
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([], "tuiwatch.Watch got an empty list of optimizers: give the optimizers, or None"),
        ("same", "tuiwatch.Watch was given the same optimizer twice: give each optimizer once"),
        ("scheduler", "tuiwatch.Watch needs a torch.optim.Optimizer (or a list of them), got StepLR"),
        (
            "own",
            "tuiwatch.Watch needs a torch.optim.Optimizer (or a list of them), got PlainSGD: an optimizer of your own "
            "is watched as updates made by hand, Watch(model) without it",
        ),
    ],
)
def test_a_bad_list_of_optimizers_is_refused_in_one_line(run_root: Path, given: object, message: str):
    model, adamw, _ = _model_and_optimizers()
    if given == "same":
        given = [adamw, adamw]
    elif given == "scheduler":
        given = [adamw, torch.optim.lr_scheduler.StepLR(adamw, 1)]
    elif given == "own":
        given = PlainSGD(model.parameters())
    with pytest.raises((TypeError, ValueError)) as refused:
        Watch(model, given, run_dir=run_root, system=False, quiet=True)  # type: ignore[arg-type]
    assert str(refused.value) == message
    assert not run_root.exists()


def _in_backward(model: nn.Module) -> dict[torch.Tensor, torch.optim.Optimizer]:
    """PyTorch's "optimizer step in backward" recipe: an optimizer a parameter, stepped and zeroed by the parameter's
    post-accumulate-grad hook as soon as its gradient is made (torchtune's optimizer_in_bwd does the same)."""
    optimizers: dict[torch.Tensor, torch.optim.Optimizer] = {
        p: torch.optim.Adam([p], lr=1e-3) for p in model.parameters()
    }

    def step(p: torch.Tensor) -> None:
        optimizers[p].step()
        optimizers[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)
    return optimizers


@pytest.mark.parametrize("on_nonfinite", ["stop", "warn"])
def test_optimizers_stepped_inside_the_backward_record_the_whole_models_gradient_norm(
    run_root: Path, on_nonfinite: str
):
    # At the first optimizer's step only its own parameter had a gradient (the others' were not made yet, or were
    # already stepped and zeroed): the step's norm was that one parameter's, 0.16 where the model's was 0.41.
    model, _, _ = _model_and_optimizers()
    norms: list[float] = []
    squares: list[float] = []

    def measure(p: torch.Tensor) -> None:
        assert p.grad is not None
        squares.append(float(p.grad.pow(2).sum()))

    for p in model.parameters():  # a parameter's hooks run in the order they were registered: this one before its step
        p.register_post_accumulate_grad_hook(measure)
    optimizers = _in_backward(model)
    watch = Watch(model, list(optimizers.values()), run_dir=run_root, on_nonfinite=on_nonfinite, quiet=True)
    with watch:
        for i in range(0, 256, 32):
            watch.step(batch=(X[i : i + 32], Y[i : i + 32]))
            loss = nn.functional.cross_entropy(model(X[i : i + 32]), Y[i : i + 32])
            watch.log(loss=loss)
            loss.backward()
            norms.append(math.sqrt(sum(squares)))
            squares.clear()
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 9))
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms, rel=1e-6)
    assert steps[0]["update_norm"] > 0


def test_optimizers_stepped_inside_the_backward_stop_before_a_nonfinite_gradients_update(run_root: Path):
    model, _, _ = _model_and_optimizers()
    first = next(model.parameters())  # the first layer's weight: its gradient is made last
    poisoned = {"at": 3, "step": 0}

    def poison(p: torch.Tensor) -> None:
        if poisoned["step"] == poisoned["at"]:
            assert p.grad is not None
            p.grad[0, 0] = math.nan

    first.register_post_accumulate_grad_hook(poison)
    optimizers = _in_backward(model)
    watch = Watch(model, list(optimizers.values()), run_dir=run_root, quiet=True)
    with pytest.raises(NonFiniteError, match="boundary=grad"), watch:
        for i in range(0, 256, 32):
            poisoned["step"] = i // 32
            watch.step(batch=(X[i : i + 32], Y[i : i + 32]))
            loss = nn.functional.cross_entropy(model(X[i : i + 32]), Y[i : i + 32])
            watch.log(loss=loss)
            before = first.detach().clone()
            loss.backward()
    assert torch.equal(first.detach(), before)  # its update was not taken
    assert torch.isfinite(first).all()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert math.isnan(steps[3]["grad_norm"])
    assert steps[3]["finite"]["grad"] is False
