"""overfit_one_batch on real CPU torch, with the bugs it is meant to name planted."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

import tuiwatch
from tuiwatch.demo.faults.log_zero import handwritten_cross_entropy
from tuiwatch.demo.problems import mlp, separable

ce = nn.functional.cross_entropy


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return separable(64, torch.Generator().manual_seed(0))


class Detached(nn.Module):
    """A forward whose output is cut from the graph (as .detach() or a NumPy round-trip does)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        return out.detach().requires_grad_()


def test_a_healthy_mlp_fits_and_the_callers_model_is_untouched(batch: tuple[torch.Tensor, torch.Tensor]):
    model = mlp(dropout=0.5)
    before = copy.deepcopy(model.state_dict())
    result = tuiwatch.overfit_one_batch(model, batch, ce, lr=1e-2)
    assert (result.passed, result.reason) == (True, "fits")
    assert result.losses[0] / result.losses[-1] >= 10
    assert result.accuracies[-1] == 1.0
    assert len(result.losses) == len(result.grad_norms) == len(result.param_deltas) == 200
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    text = str(result)
    assert text.splitlines()[0].split() == ["step", "loss", "accuracy", "grad", "norm", "param", "delta"]
    assert text.splitlines()[-2].startswith("PASSED: fits. The loss went from")
    assert text.splitlines()[-1] == "optimizer: Adam(lr=0.01)"


def test_the_seeds_own_example_fits_by_default():
    # The README's 2-32-2 MLP with dropout on 32 separable points: 100% accuracy, a loss still falling at 1e-3.
    torch.manual_seed(0)
    x, y = separable(32, torch.Generator().manual_seed(0))
    result = tuiwatch.overfit_one_batch(mlp(dropout=0.1), (x, y), ce)
    assert (result.passed, result.reason, result.optimizer) == (True, "fits", "Adam(lr=0.001)")
    assert "Accuracy is 100% from step" in result.explanation
    assert "the loss is still falling" in result.explanation


def test_the_users_optimizer_is_followed_with_weight_decay_0():
    torch.manual_seed(0)
    x, y = separable(32, torch.Generator().manual_seed(0))
    model = mlp()
    user = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)
    result = tuiwatch.overfit_one_batch(model, (x, y), ce, optimizer=user)
    assert (result.reason, result.optimizer, result.tried) == ("fits", "SGD(lr=0.1)", [])
    assert user.param_groups[0]["weight_decay"] == 0.5  # the user's optimizer is not touched


def test_without_an_optimizer_the_lr_search_says_what_it_tried():
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    y = (x @ torch.randn(4, 1)) * 3  # a regression: no accuracy, the loss must fall 10x
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    result = tuiwatch.overfit_one_batch(model, (x, y), nn.functional.mse_loss)
    assert (result.reason, result.optimizer) == ("fits", "Adam(lr=0.01)")
    assert result.tried == ["Adam(lr=0.001): slow-progress"]
    assert str(result).splitlines()[-1] == "optimizer: Adam(lr=0.01) (before it: Adam(lr=0.001): slow-progress)"


def test_a_detached_graph_is_zero_gradients_naming_the_parameters(batch: tuple[torch.Tensor, torch.Tensor]):
    result = tuiwatch.overfit_one_batch(Detached(mlp()), batch, ce)
    assert (result.passed, result.reason) == (False, "zero-gradients")
    assert "no gradient reached inner.0.weight, inner.0.bias, inner.2.weight, inner.2.bias" in result.explanation
    assert ".detach()" in result.explanation


def test_an_optimizer_over_a_copy_is_no_parameter_change(batch: tuple[torch.Tensor, torch.Tensor]):
    model = mlp()
    result = tuiwatch.overfit_one_batch(
        model, batch, ce, optimizer_factory=lambda _: torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.1)
    )
    assert result.reason == "no-parameter-change"
    assert "The optimizer holds 0 of the model's 4 parameters and its lr is 0.1" in result.explanation


def test_lr_zero_is_no_parameter_change_with_the_lr(batch: tuple[torch.Tensor, torch.Tensor]):
    result = tuiwatch.overfit_one_batch(mlp(), batch, ce, lr=0.0)
    assert result.reason == "no-parameter-change"
    assert "holds 4 of the model's 4 parameters and its lr is 0.0" in result.explanation


def test_an_extra_softmax_with_a_small_lr_is_flat_loss(batch: tuple[torch.Tensor, torch.Tensor]):
    model = nn.Sequential(mlp(), nn.Softmax(dim=1))
    result = tuiwatch.overfit_one_batch(model, batch, ce, optimizer_factory=lambda p: torch.optim.SGD(p, lr=1e-3))
    assert result.reason == "loss-flat-with-changing-parameters"
    assert "extra softmax" in result.explanation
    assert min(result.param_deltas) > 0


def test_targets_permuted_every_step_do_not_fit(batch: tuple[torch.Tensor, torch.Tensor]):
    def shuffled(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ce(output, targets[torch.randperm(len(targets))])

    result = tuiwatch.overfit_one_batch(mlp(), batch, shuffled)
    assert result.reason in ("loss-flat-with-changing-parameters", "slow-progress")
    assert not result.passed


def test_a_log_of_zero_is_nonfinite(batch: tuple[torch.Tensor, torch.Tensor]):
    x, y = batch[0].clone(), batch[1].clone()
    x[0], y[0] = torch.tensor([3e5, -2e5]), 1 - y[0]  # an outlier whose true class gets probability 0
    result = tuiwatch.overfit_one_batch(mlp(), (x, y), handwritten_cross_entropy)
    assert result.reason == "nonfinite"
    assert result.explanation.startswith("the loss is inf at step 0")


def test_publish_streams_the_steps_as_a_run(
    batch: tuple[torch.Tensor, torch.Tensor], tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    result = tuiwatch.overfit_one_batch(nn.Sequential(nn.Linear(2, 2)), batch, ce, steps=20, lr=1e-2, publish=True)
    (ledger,) = tmp_path.glob("runs/overfit-Sequential-*/ledger.jsonl")
    steps = [r for r in tuiwatch.read_ledger(ledger) if r["kind"] == "step"]
    assert [r["loss"] for r in steps] == result.losses
    assert steps[0]["accuracy"] == result.accuracies[0]


def test_a_batch_without_targets_is_a_clear_error():
    with pytest.raises(TypeError, match=r"needs the batch as \(inputs, targets\)"):
        tuiwatch.overfit_one_batch(mlp(), torch.ones(3, 2), ce)
