"""A loop that replaces its optimizer: a new one over the same model (publisher/replaced.py).

Old scripts decay their lr by building a new optimizer each epoch, and gradual unfreezing builds one over more of
the model at each stage. A Watch given the first recorded every later step without an lr, a gradient norm or an
optimizer step, and said nothing. Optimizers that do not replace the watched one (a GAN's other one, one beside it
over other parameters, one it steps inside its own step) are left alone, and SAM's base optimizer, stepped by a loop
that never calls SAM's ``step()``, is watched as SAM's updates.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuiwatch.errors import TuiwatchError
from tuiwatch.publisher.watch import Watch

from ..helpers import env_for, ledger_file, records, watch_steps
from .loops import train_on

X = torch.randn(128, 8, generator=torch.Generator().manual_seed(1))
Y = X[:, :4].argmax(1)
BATCHES = [(X[i : i + 32], Y[i : i + 32]) for i in range(0, 128, 32)]  # 4 steps an epoch


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(watch: Watch, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    train_on(watch, model, optimizer, BATCHES)


def test_a_new_optimizer_each_epoch_is_followed_with_its_lr_and_said_once(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Watch(model, optimizer, name="decay", run_dir=run_root, system=False, quiet=True) as watch:
        for epoch in range(3):
            if epoch:  # the schedule of an old script: a new optimizer at half the lr
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * 0.5**epoch, momentum=0.9)
            _train(watch, model, optimizer)
        assert watch.optimizer is optimizer
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == list(range(1, 13))
    assert [s["lr"] for s in steps] == [[0.1]] * 4 + [[0.05]] * 4 + [[0.025]] * 4
    assert all(s["grad_norm"] is not None and s["grad_norm"] > 0 for s in steps)
    # The update norm, sampled every 10th optimizer step (the 1st, the 11th), is the third optimizer's at step 10.
    assert [s["step"] for s in steps if s["update_norm"] is not None] == [0, 10]
    assert capsys.readouterr().err.splitlines() == [
        "tuiwatch: decay: the loop replaced its optimizer at step 4: a new SGD over the model's parameters, whose lr, "
        "norms and updates are read from there on (and those of any later one that replaces it)"
    ]


def test_gradual_unfreezing_follows_the_optimizer_over_more_of_the_model(run_root: Path):
    model = _model()
    backbone, head = model[0], model[2]
    backbone.requires_grad_(False)
    optimizer: torch.optim.Optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        _train(watch, model, optimizer)
        backbone.requires_grad_(True)
        optimizer = torch.optim.AdamW(
            [{"params": backbone.parameters(), "lr": 1e-4}, {"params": head.parameters(), "lr": 1e-3}]
        )
        before = [p.detach().clone() for p in backbone.parameters()]
        _train(watch, model, optimizer)
    steps = watch_steps(watch)
    assert [s["lr"] for s in steps] == [[1e-3]] * 4 + [[1e-4, 1e-3]] * 4
    assert all(s["opt_step"] == s["step"] + 1 for s in steps)
    assert not any(torch.equal(b, p) for b, p in zip(before, backbone.parameters(), strict=True))


def test_a_checkpoint_holds_the_optimizer_and_scheduler_that_replaced_the_first(run_root: Path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: no state
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
    with Watch(model, optimizer, scheduler=scheduler, run_dir=run_root, system=False, quiet=True) as watch:
        _train(watch, model, optimizer)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        for x, y in watch.batches(BATCHES):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        state = watch.checkpoint_state()
    assert watch.scheduler is scheduler
    assert state["optimizer"] == optimizer.state_dict()
    assert len(state["optimizer"]["state"]) == 4  # the new one's momentum for each of the 4 parameters
    assert state["scheduler"]["last_epoch"] == 4
    assert [s["lr"] for s in watch_steps(watch)][4:] == [[0.05], [0.05], [0.025], [0.025]]


def test_optimizers_that_replace_nothing_are_left_alone(run_root: Path, capsys: pytest.CaptureFixture[str]):
    # A GAN's discriminator optimizer (another model), an optimizer over part of the model beside the watched one
    # (an embedding's SparseAdam beside Adam), and a copy of the model's optimizer (a stale snapshot model).
    model, discriminator, copy = _model(), nn.Linear(4, 1), _model()
    watched = torch.optim.Adam(list(model.parameters())[2:], lr=1e-3)
    others = [
        torch.optim.Adam(discriminator.parameters(), lr=1e-3),
        torch.optim.SGD(list(model.parameters())[:2], lr=0.01),
        torch.optim.SGD(copy.parameters(), lr=0.01),
    ]
    with Watch(model, watched, name="left", run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(BATCHES * 2):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss = loss + discriminator(model(x)).mean() + copy(x).sum()
            for o in (watched, *others):
                o.zero_grad()
            loss.backward()
            for o in (*others, watched):  # each steps before the watched one, every step
                o.step()
        assert watch.optimizer is watched
    steps = watch_steps(watch)
    assert [s["lr"] for s in steps] == [[1e-3]] * 8
    assert [s["opt_step"] for s in steps] == list(range(1, 9))
    assert "replaced its optimizer" not in capsys.readouterr().err


class Lookahead(torch.optim.Optimizer):
    """An optimizer of its own over another, which it steps inside its own step (Zhang et al., 2019)."""

    def __init__(self, inner: torch.optim.Optimizer, k: int = 2, alpha: float = 0.5) -> None:
        self.optimizer, self.k, self.alpha, self.calls = inner, k, alpha, 0
        super().__init__([p for g in inner.param_groups for p in g["params"]], {"lr": inner.defaults["lr"]})
        self.slow = [p.detach().clone() for p in self.param_groups[0]["params"]]

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        self.optimizer.step()
        self.calls += 1
        if self.calls % self.k == 0:
            for slow, fast in zip(self.slow, self.param_groups[0]["params"], strict=True):
                slow.add_(fast - slow, alpha=self.alpha)
                fast.copy_(slow)


def test_an_optimizer_stepped_inside_the_watched_ones_step_is_not_a_replacement(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    model = _model()
    lookahead = Lookahead(torch.optim.SGD(model.parameters(), lr=0.1))
    with Watch(model, lookahead, run_dir=run_root, system=False, quiet=True) as watch:
        _train(watch, model, lookahead)
        assert watch.optimizer is lookahead
    assert [s["opt_step"] for s in watch_steps(watch)] == [1, 2, 3, 4]
    assert capsys.readouterr().err == ""


class SAM(torch.optim.Optimizer):
    """davda54/sam's sharpness-aware minimization, abridged: its base optimizer shares its param_groups."""

    def __init__(self, params: Any, base: type[torch.optim.Optimizer], rho: float = 0.05, **kwargs: Any) -> None:
        super().__init__(params, {"rho": rho, **kwargs})
        self.base_optimizer = base(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self) -> None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        scale = self.param_groups[0]["rho"] / (torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) + 1e-12)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["old_p"] = p.detach().clone()
                p.add_(p.grad * scale)
        self.zero_grad()

    @torch.no_grad()
    def second_step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.copy_(self.state[p]["old_p"])
        self.base_optimizer.step()
        self.zero_grad()


def test_sams_base_optimizer_stepped_by_second_step_makes_the_updates(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    # The loop davda54/sam's README shows never calls SAM's step(), whose hooks measured nothing: every step had no
    # lr, no gradient norm and no optimizer step.
    model = _model()
    sam = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    with Watch(model, sam, run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(BATCHES):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            sam.first_step()
            nn.functional.cross_entropy(model(x), y).backward()
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))  # type: ignore[union-attr]
            watch.log(sam_grad_norm=norm)
            sam.second_step()
        assert watch.optimizer is sam
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4]
    assert [s["lr"] for s in steps] == [[0.1]] * 4
    # The gradient SAM's update applies: the second one, at the perturbed point.
    assert [s["grad_norm"] for s in steps] == pytest.approx([s["sam_grad_norm"] for s in steps])
    assert capsys.readouterr().err == ""


HOGWILD = """
import os, sys, torch
from torch import nn
from tuiwatch.publisher.watch import Watch

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
x = torch.randn(32, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with Watch(model, optimizer, run_dir=sys.argv[1], system=False, quiet=True) as watch:
    pid = os.fork()
    if pid == 0:  # the child, as mnist_hogwild's train(): an optimizer of its own over the shared model
        own = torch.optim.SGD(model.parameters(), lr=0.01)
        nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        own.step()
        os._exit(0 if watch.optimizer is optimizer else 3)
    assert os.waitpid(pid, 0)[1] == 0, "the child's Watch followed its optimizer"
    for _ in range(4):
        watch.step()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        optimizer.step()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_childs_new_optimizer_is_not_followed(run_root: Path, socket_dir: Path):
    # mnist_hogwild: each child builds its own optimizer over the shared model. The parent's Watch, inherited by the
    # child and off there, follows nothing and says nothing in it. (In a process of its own: torch's autograd engine,
    # once it has run in the parent, hangs a forked child's backward.)
    done = subprocess.run(
        # (Python 3.12 on warns at the script's own fork() in a process with threads: the Watch's thread, here)
        [sys.executable, "-W", "ignore:This process:DeprecationWarning", "-c", HOGWILD, str(run_root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_for(socket_dir),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert [s["opt_step"] for s in records(ledger_file(run_root), "step")] == [1, 2, 3, 4]


def test_watches_that_start_and_end_leave_torchs_global_step_hooks_as_they_were(run_root: Path):
    # torch iterates that dict while its hooks run, and a Watch may start (tuiwatch run's, inside its own global
    # hook) or be collected (an Optuna trial's) meanwhile: a hook added or removed then raised "OrderedDict mutated
    # during iteration" in the loop's optimizer.step(). tuiwatch registers one there, once in a process.
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    model = _model()
    Watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=run_root, system=False, quiet=True).close()
    before = list(_global_optimizer_pre_hooks)
    with Watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=run_root, system=False, quiet=True):
        assert list(_global_optimizer_pre_hooks) == before
    unclosed = Watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=run_root, system=False, quiet=True)
    del unclosed
    gc.collect()
    assert list(_global_optimizer_pre_hooks) == before


class FailsOnce(torch.optim.SGD):
    """An SGD whose fourth step runs out of memory, as a loop that catches an OOM and goes on meets it."""

    calls = 0

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.calls += 1
        if self.calls == 4:
            raise torch.OutOfMemoryError("out of memory (in the test)")
        return super().step(closure)


def test_a_step_that_raised_inside_the_watched_optimizer_does_not_stop_a_later_replacement(run_root: Path):
    model = _model()
    optimizer: torch.optim.Optimizer = FailsOnce(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(BATCHES):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            try:
                optimizer.step()
            except torch.OutOfMemoryError:
                continue  # the loop skips the batch (the epoch's last: nothing steps in between)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        _train(watch, model, optimizer)
        assert watch.optimizer is optimizer
    assert [s["lr"] for s in watch_steps(watch)][-4:] == [[0.05]] * 4


def test_a_checkpoint_after_unfreezing_resumes_into_that_stages_optimizer_and_refuses_the_first(
    run_root: Path, tmp_path: Path
):
    def stage(model: nn.Sequential, unfrozen: bool) -> torch.optim.Optimizer:
        model[0].requires_grad_(unfrozen)
        if not unfrozen:
            return torch.optim.Adam(model[2].parameters(), lr=1e-3)
        groups: list[dict[str, Any]] = [
            {"params": model[0].parameters(), "lr": 1e-4},
            {"params": model[2].parameters()},
        ]
        return torch.optim.Adam(groups)

    model = _model()
    optimizer = stage(model, False)
    with Watch(model, optimizer, run_dir=run_root / "a", system=False, quiet=True) as watch:
        _train(watch, model, optimizer)
        optimizer = stage(model, True)
        _train(watch, model, optimizer)
        torch.save(watch.checkpoint_state(), tmp_path / "ckpt.pt")
    weights = [p.detach().clone() for p in _model().parameters()]
    fresh = _model()
    # Torch's own "loaded state dict has a different number of parameter groups" came after the model was loaded.
    options: dict[str, Any] = {"system": False, "quiet": True, "resume_from": tmp_path / "ckpt.pt"}
    with pytest.raises(TuiwatchError) as refused:
        Watch(fresh, stage(fresh, False), run_dir=run_root / "b", **options)
    assert str(refused.value) == (
        "the checkpoint's optimizer has param groups of [2, 2] parameters and the Watch's of [2]: build the optimizer "
        "the run had when it wrote the checkpoint (a loop that replaced its optimizer, at a stage of unfreezing, had "
        "another) and give it to Watch(..., resume_from=...)"
    )
    assert all(torch.equal(w, p) for w, p in zip(weights, fresh.parameters(), strict=True))  # nothing loaded
    resumed = stage(fresh, True)
    with Watch(fresh, resumed, run_dir=run_root / "c", **options):
        assert all(torch.equal(w, p) for w, p in zip(model.parameters(), fresh.parameters(), strict=True))
        saved, loaded = optimizer.state_dict()["state"], resumed.state_dict()["state"]
        assert sorted(saved) == sorted(loaded) == list(range(4))
        assert all(torch.equal(saved[i]["exp_avg"], loaded[i]["exp_avg"]) for i in saved)


def test_a_failure_while_following_never_fails_the_loops_step(run_root: Path, monkeypatch: pytest.MonkeyPatch):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:

        def broken(new: Any) -> Any:
            raise RuntimeError("a bug of tuiwatch's")

        monkeypatch.setattr(watch._hooks, "replace_optimizer", broken)
        new = torch.optim.SGD(model.parameters(), lr=0.05)
        before = [p.detach().clone() for p in model.parameters()]
        _train(watch, model, new)  # raised out of new.step() before
        assert watch.optimizer is optimizer
    assert not any(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))  # the loop trained
