"""A model whose own forward the loop never calls is watched by its parts (parts.py).

The shapes are those of real code: Lightning's README ``LitAutoEncoder`` (no
``forward``; ``training_step`` calls ``self.encoder`` and ``self.decoder``),
CleanRL's ``Agent`` (``get_action_and_value`` calls ``self.actor`` and
``self.critic``), and a loop that calls ``model.forward(x)``. Before, the
Watch's hook on the root module saw none of their calls: ``finite.forward``
and the phases were null at every step, and a NaN the model made was
blamed on nothing it had checked.
"""

from __future__ import annotations

import copy
import copyreg
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuiwatch.ledger.records import Record
from tuiwatch.publisher import compiling
from tuiwatch.publisher.hooks import OUTPUT_PROBES
from tuiwatch.publisher.parts import has_forward, model_parts
from tuiwatch.publisher.watch import Watch

from ..helpers import records, watch_steps


class AutoEncoder(nn.Module):
    """Lightning's README module without Lightning: parts and no forward."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 8))


class WithForward(AutoEncoder):
    def forward(self, x: torch.Tensor) -> Any:
        return self.decoder(self.encoder(x))


def _batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(16, 8, generator=g) for _ in range(n)]


def _ledger(watch: Watch, kind: str) -> list[Record]:
    assert watch.ledger_path is not None
    return records(watch.ledger_path, kind)


def _train(model: AutoEncoder, run_root: Path, steps: int, *, call: str = "parts") -> Watch:
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for x in watch.batches(_batches(steps)):
            x_hat = model.forward(x) if call == "forward" else model.decoder(model.encoder(x))
            loss = nn.functional.mse_loss(x_hat, x)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return watch


def test_a_model_without_a_forward_has_its_parts_outputs_checked_and_its_phases_timed(run_root: Path):
    model = AutoEncoder()
    steps = watch_steps(_train(model, run_root, 6))
    assert [s["finite"]["forward"] for s in steps] == [True] * 6
    for s in steps:
        assert None not in (s["forward_s"], s["backward_s"], s["optimizer_s"])
        # forward_s runs to the decoder's return, the last part before the optimizer: the whole forward
        assert s["forward_s"] + s["backward_s"] + s["optimizer_s"] <= s["compute_s"] + 1e-6


def test_a_nan_made_by_a_part_is_blamed_on_the_model_not_on_the_loss(run_root: Path):
    class Poisoned(AutoEncoder):
        pass

    model = Poisoned()
    poison = {"on": False}

    def bad_decoder(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output * math.nan if poison["on"] else output

    model.decoder.register_forward_hook(bad_decoder)  # registered first: the Watch's hook sees its output
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True, on_nonfinite="warn") as watch:
        for i, x in enumerate(watch.batches(_batches(4))):
            poison["on"] = i == 2
            loss = nn.functional.mse_loss(model.decoder(model.encoder(x)), x)
            watch.log(loss=loss)
            loss.backward()
            opt.zero_grad()
    steps = watch_steps(watch)
    assert [s["finite"]["forward"] for s in steps] == [True, True, False, True]
    alerts = [r for r in _ledger(watch, "alert") if r["rule"] == "nonfinite"]
    assert alerts[0]["step"] == 2
    assert alerts[0]["evidence"]["boundary"] == "forward"
    assert "unchecked" not in alerts[0]["evidence"]


def test_a_loop_that_calls_model_forward_is_watched_by_its_parts_from_the_second_optimizer_step(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(compiling, "left_out", False)  # as in a process that compiled nothing whole
    model = WithForward()
    steps = watch_steps(_train(model, run_root, 5, call="forward"))
    # Steps 0 and 1 went by without a forward the Watch saw; at step 1's optimizer step it took the parts.
    assert [s["finite"]["forward"] for s in steps] == [None, None, True, True, True]


def test_a_model_called_as_itself_keeps_its_own_hook(run_root: Path):
    model = WithForward()
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for x in watch.batches(_batches(4)):
            loss = nn.functional.mse_loss(model(x), x)
            loss.backward()
            opt.step()
            opt.zero_grad()
            assert (len(model._forward_hooks), len(model.encoder._forward_hooks)) == (1, 0)
    assert [s["finite"]["forward"] for s in watch_steps(watch)] == [True] * 4


def test_validation_through_the_parts_tells_the_models_mode(run_root: Path):
    model = AutoEncoder()
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for i, x in enumerate(watch.batches(_batches(4))):
            loss = nn.functional.mse_loss(model.decoder(model.encoder(x)), x)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i in (1, 3):
                if i == 3:
                    model.eval()
                with watch.validation(), torch.no_grad():
                    watch.log(val_loss=nn.functional.mse_loss(model.decoder(model.encoder(x)), x))
                model.train()
    evals = _ledger(watch, "eval")
    assert [(e["step"], e["training"]) for e in evals] == [(1, True), (3, False)]
    alerts = _ledger(watch, "alert")
    assert [(a["rule"], a["step"], a["severity"]) for a in alerts] == [
        ("eval-mode", 1, "warning"),
        ("eval-mode", 3, "info"),
    ]


def test_a_step_of_more_part_calls_than_are_checked_leaves_its_output_unchecked(run_root: Path):
    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = nn.RNNCell(4, 4)
            self.head = nn.Linear(4, 1)

    model = Recurrent()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(3, 4)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for length in (4, OUTPUT_PROBES + 1):
            watch.step()
            h = torch.zeros(3, 4)
            for _ in range(length):
                h = model.cell(x, h)
            loss = model.head(h).pow(2).mean()
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    steps = watch_steps(watch)
    # Checked in part, the head's output (the one the loss reads) would be said finite unseen: not checked at all.
    assert [s["finite"]["forward"] for s in steps] == [True, None]
    assert [s["forward_s"] is None for s in steps] == [True, True]  # the cell, first called, ran 4 and 65 times


def test_parts_are_the_outermost_submodules_with_a_forward_and_parameters():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])  # no forward: its items are parts
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 1)})
            self.criterion = nn.CrossEntropyLoss()  # no parameters: not the model's
            self.act = nn.ReLU()
            self.trunk = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # a part; its layers are inside it

    net = Net()
    assert model_parts(net) == [net.blocks[0], net.blocks[1], net.heads["a"], net.trunk]
    assert [has_forward(m) for m in (net, net.trunk, net.blocks)] == [False, True, False]


def test_copies_of_a_watched_part_are_normal_modules_and_close_takes_every_hook_off(run_root: Path):
    model = AutoEncoder()
    before = copyreg.dispatch_table.get(nn.Sequential)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = Watch(model, opt, run_dir=run_root, system=False, quiet=True)
    try:
        assert len(model.encoder._forward_hooks) == 1
        assert not copy.deepcopy(model.encoder)._forward_hooks
        assert b"tuiwatch" not in pickle.dumps(model)
        torch.save(model.state_dict(), run_root / "w.pt")
    finally:
        watch.close()
    assert [len(m._forward_hooks) for m in (model, model.encoder, model.decoder)] == [0, 0, 0]
    assert copyreg.dispatch_table.get(nn.Sequential) is before


def test_a_forward_inside_the_optimizers_step_has_no_phases(run_root: Path):
    """optimizer.step(closure), evaluated once (SGD's): its forward ends after the step began. The three moments
    read as a backward of 0 s and an update that held the whole step; now they are not split."""
    torch.manual_seed(0)
    model = WithForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = _batches(1)[0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), x)
        loss.backward()
        return loss

    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            watch.step()
            watch.log(loss=opt.step(closure))
    steps = watch_steps(watch)
    assert [s["forward_s"] for s in steps] == [None] * 3
    assert [s["finite"]["forward"] for s in steps] == [True] * 3  # still checked


@pytest.mark.parametrize("call", ["parts", "forward"])
def test_the_ledger_of_a_healthy_run_of_parts_raises_no_alert(
    run_root: Path, call: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(compiling, "left_out", False)
    model = AutoEncoder() if call == "parts" else WithForward()
    watch = _train(model, run_root, 30, call=call)
    assert [r for r in _ledger(watch, "alert") if r["severity"] != "info"] == []
