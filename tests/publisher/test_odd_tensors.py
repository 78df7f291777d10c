"""Batches and outputs of layouts the measurements' usual path cannot read never fail the training step.

A sparse COO tensor has no ``nbytes`` (pytorch/examples' gcn feeds its node
features and adjacency matrix as sparse tensors); a nested tensor of ragged
parts has neither a shape nor a sum. The step record then says what can be
read and leaves the rest null.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

from tuiwatch.publisher.watch import Watch

from ..helpers import records, watch_steps


class GraphConv(nn.Module):
    """gcn's layer: sparse features times weights, aggregated over a sparse normalised adjacency."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.sparse.mm(adj, torch.sparse.mm(x, self.weight))
        return out


def test_a_batch_of_sparse_tensors_trains_and_is_recorded(run_root: Path, socket_dir: Path):
    torch.manual_seed(0)
    nodes, features = 30, 6
    x = (torch.rand(nodes, features) < 0.3).float().to_sparse()
    adj = (torch.eye(nodes) + (torch.rand(nodes, nodes) < 0.1).float()).to_sparse()
    labels = torch.randint(0, 3, (nodes,))
    model = GraphConv(features, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            watch.step(batch=(x, adj))
            loss = nn.functional.cross_entropy(model(x, adj), labels)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all(s["batch_shape"] == [[nodes, features], [nodes, nodes]] for s in steps)
    assert all(s["finite"]["batch"] is True and s["finite"]["forward"] is True for s in steps)
    assert all(s["grad_norm"] > 0 for s in steps)


class Ragged(nn.Module):
    """A model fed sequences of different lengths as one nested tensor, returning one (a nested tensor as output)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        return torch.nested.as_nested_tensor([self.proj(s) for s in seqs.unbind()])


def test_nested_tensors_as_the_batch_and_the_output_train_and_leave_what_they_cannot_say_null(
    run_root: Path, socket_dir: Path
):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "nested tensors are in prototype stage"
        batches = [
            (torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(5, 4)]), torch.ones(2)) for _ in range(3)
        ]
    model = Ragged()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for seqs, weights in watch.batches(batches):
            out = model(seqs)
            loss = sum(w * t.pow(2).mean() for w, t in zip(weights, out.unbind(), strict=True))
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all(s["batch_shape"] == [None, [2]] for s in steps)  # the ragged part has no shape
    assert all(s["finite"]["batch"] is True for s in steps)  # the dense part's
    assert all(s["finite"]["forward"] is None for s in steps)  # a nested output cannot be summed: not checked
    assert all(s["loss"] > 0 and s["grad_norm"] > 0 for s in steps)


def test_sparse_gradients_have_their_norm(run_root: Path, socket_dir: Path):
    """nn.Embedding(sparse=True) makes sparse COO gradients, which torch's fused norm refuses (clip_grad_norm_ too):
    the step still trains, and its norm is the dense one, duplicate indices added up."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 4, sparse=True), nn.Flatten(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    truth = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            x, y = torch.randint(0, 50, (4, 2)), torch.randint(0, 2, (4,))
            x[1, 0] = x[0, 0]  # one row twice: the sparse gradient holds it twice, uncoalesced
            watch.step(batch=(x, y))
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            assert model[0].weight.grad is not None
            assert model[0].weight.grad.is_sparse
            grads = [p.grad.to_dense() for p in model.parameters() if p.grad is not None]
            truth.append(torch.cat([g.reshape(-1) for g in grads]).norm().item())
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["grad_norm"] for s in steps] == pytest.approx(truth, rel=1e-5)
    assert steps[0]["update_norm"] == pytest.approx(0.1 * truth[0], rel=1e-5)  # SGD: lr times the gradient


def test_a_lazy_model_is_watched_before_its_first_forward(run_root: Path, socket_dir: Path):
    """nn.LazyLinear has no parameter sizes until its first forward: Watch() used to fail counting them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "Lazy modules are a new feature under heavy development"
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(2):
            x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
            watch.step(batch=(x, y))
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert watch.ledger_path is not None
    assert records(watch.ledger_path, "run")[0]["params"] is None  # unknown when the run began
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1]
    assert steps[0]["grad_norm"] > 0
    assert steps[0]["param_norm"] > 0  # the parameters made by the first forward


class Proxy:
    """A lazy object that raises on any attribute it cannot resolve, as a remote or lazy proxy does."""

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"proxy not connected: {name}")


class ClosedStore(Mapping[str, torch.Tensor]):
    """Features read on demand from a store that has been closed: reading a value raises."""

    def __getitem__(self, key: str) -> torch.Tensor:
        raise RuntimeError(f"feature store closed: {key}")

    def __iter__(self) -> Iterator[str]:
        return iter(["depth"])

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("extra", [Proxy, ClosedStore], ids=["proxy", "closed-store"])
def test_a_batch_part_that_raises_when_looked_into_never_fails_the_step(run_root: Path, extra: type):
    # A part that raised on the walk raised again on the tolerant walk, out of watch.batches() into the loop.
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for x in watch.batches([(torch.randn(8, 4), extra()) for _ in range(3)]):
            loss = model(x[0]).square().mean()
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all(s["finite"]["batch"] is None for s in steps)  # a part not read: the batch is not called finite
    assert all(s["loss"] is not None for s in steps)
