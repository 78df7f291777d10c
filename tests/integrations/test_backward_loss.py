"""The loss of a loop that does not log it: the scalars backward() ran on, each counted once, however called."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tuiwatch.integrations.loss import BackwardLoss


@pytest.fixture
def loss_seen():
    seen = BackwardLoss()
    seen.install()
    try:
        yield seen
    finally:
        seen.remove()


def _loss(scale: float = 1.0) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    out: torch.Tensor = model(torch.ones(4, 3))
    return out.pow(2).mean() * scale


def test_tensor_backward_counts_its_loss_once(loss_seen: BackwardLoss):
    loss = _loss()
    loss.backward()  # Tensor.backward calls torch.autograd.backward inside: still one count
    assert loss_seen.take() == pytest.approx(loss.item())
    assert loss_seen.take() is None


def test_torch_autograd_backward_called_directly_counts_each_scalar(loss_seen: BackwardLoss):
    a, b = _loss(), _loss(2.0)
    torch.autograd.backward(a)
    assert loss_seen.take() == pytest.approx(a.item())
    a, b = _loss(), _loss(2.0)
    torch.autograd.backward([a, b])  # two losses descended together: their sum
    assert loss_seen.take() == pytest.approx(a.item() + b.item())


def test_a_weighted_backward_is_not_a_loss(loss_seen: BackwardLoss):
    out = _loss() * torch.ones(2)  # not a scalar
    torch.autograd.backward(out, grad_tensors=torch.tensor([0.5, 0.5]))
    scalar = _loss()
    torch.autograd.backward(scalar, torch.tensor(3.0))  # a gradient given: a weighting, not the loss
    assert loss_seen.take() is None


def test_removed_leaves_torch_as_it_was():
    before = (torch.Tensor.backward, torch.autograd.backward, torch.amp.GradScaler.scale)
    seen = BackwardLoss()
    seen.install()
    assert torch.autograd.backward is not before[1]
    seen.remove()
    assert (torch.Tensor.backward, torch.autograd.backward, torch.amp.GradScaler.scale) == before
    _loss().backward()
    assert seen.take() is None


def test_losses_on_two_devices_are_summed_on_the_first_and_a_loss_that_cannot_be_added_never_raises():
    # Inside the loop's backward: a model split over two GPUs backpropagates a [1]-shaped loss on each, which
    # torch cannot add where they are; the sum raised out of the user's backward() and ended the run.
    seen = BackwardLoss()
    seen.add(torch.tensor([0.5]))
    seen.add(torch.tensor([0.25], dtype=torch.float64))
    total = seen.take()
    assert total is not None
    assert total.item() == 0.75
    # A device the sum cannot be moved to or from here (meta: no data) stands in for one that fails: no raise,
    # and that step records no loss rather than a part of it; the next step is read again.
    seen.add(torch.tensor([0.5]))
    seen.add(torch.tensor([1.0], device="meta"))
    seen.add(torch.tensor([2.0]))
    assert seen.take() is None
    seen.add(torch.tensor(3.0))
    total = seen.take()
    assert total is not None
    assert total.item() == 3.0
