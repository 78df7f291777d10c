"""The gradient norm of a small model, read as one flat copy's dot with itself, is the norm read tensor by tensor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

from tuiwatch.publisher.measure import FLAT_ELEMENTS_PER_TENSOR, flat_normable, gradient_norm, total_norm
from tuiwatch.publisher.watch import Watch

from ..helpers import records


def exact(tensors: Sequence[torch.Tensor | None]) -> float:
    """The 2-norm in float64, element by element."""
    return math.sqrt(math.fsum(float(v) ** 2 for t in tensors if t is not None for v in t.detach().double().flatten()))


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))


def test_small_dense_float_parameters_on_the_cpu_are_normed_flat_and_others_are_not():
    assert flat_normable(list(tiny().parameters()))
    wide = [torch.zeros(FLAT_ELEMENTS_PER_TENSOR + 1), torch.zeros(FLAT_ELEMENTS_PER_TENSOR - 1)]
    assert flat_normable(wide)  # (the average counts: 2,048 elements a tensor)
    assert not flat_normable([torch.zeros(FLAT_ELEMENTS_PER_TENSOR + 2), torch.zeros(FLAT_ELEMENTS_PER_TENSOR - 1)])
    assert not flat_normable([torch.zeros(3), torch.zeros(3, dtype=torch.float64)])  # two dtypes
    assert not flat_normable([torch.zeros(3, dtype=torch.float16)])  # half: its squares lose too much
    assert not flat_normable([torch.zeros(1)] * 33)  # many tensors
    assert not flat_normable([torch.zeros(3).to_sparse()])
    assert not flat_normable([])

    class Marked(torch.Tensor):  # a subclass's ops are its own (FSDP's DTensor: test_distributed.py)
        pass

    assert not flat_normable([torch.zeros(3).as_subclass(Marked)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_flat_norm_is_the_norm_read_tensor_by_tensor(dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn(32, 2, generator=g, dtype=dtype), torch.randn(32, generator=g, dtype=dtype) * 3]
    tensors.append(torch.randn(2, 32, generator=g, dtype=dtype) * 1e-3)
    flat, each = gradient_norm(tensors, flat=True), gradient_norm(tensors)
    assert type(flat) is float
    assert math.isclose(flat, exact(tensors), rel_tol=1e-6)
    assert math.isclose(flat, each, rel_tol=1e-6)


@pytest.mark.parametrize("scale", [1e25, 1e18, 1e-18, 1e-25])
def test_squares_out_of_the_flat_range_are_read_tensor_by_tensor(scale: float):
    """Elements whose float32 squares overflow or lose their digits (beyond ~1e19, under ~1e-19) are read as the
    norm of each tensor, as before: the norm torch's ``clip_grad_norm_`` reports too (inf at 1e25, 0 at 1e-25,
    both in float32), where the flat dot would have given inf at 1e18 and 0 at 1e-18."""
    tensors = [torch.full((4, 3), scale), torch.full((3,), -scale)]
    norm = gradient_norm(tensors, flat=True)
    assert norm == gradient_norm(tensors)
    torch_s = float(torch.nn.utils.get_total_norm(tensors))
    assert norm == torch_s or math.isclose(norm, torch_s, rel_tol=1e-6)
    if 1e-20 < scale < 1e20:
        assert math.isclose(norm, scale * math.sqrt(15), rel_tol=1e-6)


@pytest.mark.parametrize(("bad", "check"), [(math.nan, math.isnan), (math.inf, math.isinf)])
def test_a_value_that_is_not_finite_gives_a_norm_that_is_not(bad: float, check):
    tensors = [torch.ones(3), torch.tensor([1.0, bad])]
    assert check(gradient_norm(tensors, flat=True))


def test_a_sparse_gradient_of_a_dense_parameter_is_normed_all_the_same():
    torch.manual_seed(0)
    embedding, head = nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1)
    head(embedding(torch.tensor([1, 2, 2]))).sum().backward()
    params = [*embedding.parameters(), *head.parameters()]
    assert flat_normable(params)  # (the parameters are dense: the gradient is not)
    grads = [p.grad for p in params]
    assert all(g is not None for g in grads)
    dense = [g.to_dense() for g in grads if g is not None]
    assert math.isclose(gradient_norm([g for g in grads if g is not None], flat=True), exact(dense), rel_tol=1e-6)


def test_the_parameter_norm_flat_under_no_grad_is_the_norm():
    params = list(tiny().parameters())
    norm = total_norm(params, flat=True)
    assert math.isclose(norm, exact(params), rel_tol=1e-6)


def test_a_watched_small_model_records_the_norms_of_its_gradients(run_root: Path, socket_dir: Path):
    """In a run: each step's pre-update gradient norm and every 10th step's parameter norm, as computed by hand."""
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(2))
    y = (x[:, 0] > 0).long()
    grads, params = [], []
    with Watch(model, opt, name="norms", run_dir=run_root, quiet=True, system=False) as watch:
        for step in range(12):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            grads.append(exact([p.grad for p in model.parameters()]))
            opt.step()
            if step % 10 == 0:
                params.append(exact(list(model.parameters())))
            opt.zero_grad(set_to_none=True)
            watch.step()
        path = watch.ledger_path
    assert path is not None
    steps = records(path, "step")
    assert len(steps) == 12
    for s, norm in zip(steps, grads, strict=True):
        assert math.isclose(s["grad_norm"], norm, rel_tol=1e-6)
    sampled = [s["param_norm"] for s in steps if s["param_norm"] is not None]
    assert len(sampled) == len(params) == 2
    for got, norm in zip(sampled, params, strict=True):
        assert math.isclose(got, norm, rel_tol=1e-6)
