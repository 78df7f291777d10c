"""torch.compile around a watched model or its optimizer's step: what it compiles is what it would compile unwatched.

Dynamo traced tuiwatch's hooks where it met them: their clock reads and ``.item()`` split the compiled code into
more graphs, and dynamo wrote warnings about tuiwatch's lines into the run's output. The hooks are now
``torch.compiler.disable``d: they run as they are, between graphs. Where the user asked for one graph
(``fullgraph=True``, a strict export), that break raised at the first forward: there the forward hook is left out.
``backend="eager"``: dynamo's tracing without a C++ toolchain.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch._dynamo
from torch import nn

import tuiwatch
from tuiwatch.publisher import compiling

from ..helpers import records, watch_steps


@contextmanager
def dynamo_counted() -> Iterator[Callable[[], tuple[int, list[str]]]]:
    """Counts dynamo's graphs and the warnings it gives while the block runs."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield lambda: (
                torch._dynamo.utils.counters["stats"]["unique_graphs"],
                [str(w.message) for w in caught if "ynamo" in str(w.message)],
            )
        finally:
            torch._dynamo.reset()


def _watched_mlp(run_root: Path) -> tuple[nn.Module, torch.optim.Optimizer, tuiwatch.Watch]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)


def _train(
    watch: tuiwatch.Watch, calls: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4
) -> list[float]:
    """``steps`` steps of ``model``, called through ``calls`` (itself or a compiled wrapper); the gradient norms."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 2, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(steps)]
    norms: list[float] = []
    for x, y in watch.batches(batches):
        loss = nn.functional.cross_entropy(calls(x), y)
        watch.log(loss=loss)
        loss.backward()
        norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])))
        optimizer.step()
        optimizer.zero_grad()
    return norms


def test_a_model_compiled_after_the_watch_hooked_it_is_one_graph(run_root: Path, socket_dir: Path):
    # The Watch made before torch.compile, or a Trainer's torch_compile=True with its callback's pre-hook on the
    # model: three graphs instead of one.
    with dynamo_counted() as counted:
        model, optimizer, watch = _watched_mlp(run_root)
        _train(watch, cast(nn.Module, torch.compile(model, backend="eager")), model, optimizer)
        watch.close()
        assert counted() == (1, [])
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(s["finite"]["forward"] is True and s["forward_s"] is not None for s in steps)
    assert [s.get("classes") for s in steps] == [2, None, None, None]


def test_a_compiled_optimizer_step_is_one_graph_and_still_measured(run_root: Path, socket_dir: Path):
    # PyTorch's recipe "Compiling the optimizer with torch.compile": a tensor lr, opt.step() in a compiled function.
    # The Watch's optimizer hooks made it ten graphs.
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))
    norms: list[float] = []

    def step() -> Any:
        opt.step()

    with dynamo_counted() as counted:
        compiled_step = torch.compile(step, fullgraph=False, backend="eager")
        with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
            for _ in range(4):
                watch.step()
                loss = model(torch.rand(8, 16)).sum()
                watch.log(loss=loss)
                loss.backward()
                norms.append(
                    float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
                )
                compiled_step()
                opt.zero_grad()
        assert counted() == (1, [])
    steps = watch_steps(watch)
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4]
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms, rel=1e-6)
    assert [s["lr"] for s in steps] == [[torch.tensor(0.01).item()]] * 4
    assert steps[0]["update_norm"] is not None


@pytest.mark.parametrize("whole", ["fullgraph", "error_on_graph_break"])
def test_a_model_compiled_as_one_graph_after_the_watch_hooked_it_trains_without_the_forward_hook(
    whole: str, run_root: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # The hook's graph break raised "Skip inlining `torch.compiler.disable()`d function" at the first forward: the
    # run died where the user asked dynamo for one graph. There the hook is left out of the compiled forward.
    monkeypatch.setattr(compiling, "left_out", False)  # (restored after: the flag is the process's)
    with dynamo_counted() as counted:
        model, optimizer, watch = _watched_mlp(run_root)
        compiled = cast(nn.Module, torch.compile(model, backend="eager", fullgraph=whole == "fullgraph"))
        with torch._dynamo.error_on_graph_break(whole == "error_on_graph_break"):
            norms = _train(watch, compiled, model, optimizer)
        watch.close()
        # One graph: the forwards the Watch did not see did not make it watch the model's parts (parts.py), whose
        # hooks would have made dynamo compile the model again.
        assert counted() == (1, [])
        assert compiling.left_out
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms, rel=1e-6)  # the optimizer's hooks are eager
    # What the forward hook measures inside the compiled forward is not measured (docs/architecture.md).
    assert {(s["finite"]["forward"], s["forward_s"]) for s in steps} == {(None, None)}
    assert watch.ledger_path is not None
    assert records(watch.ledger_path, "alert") == []
    # Eagerly the same model is measured as ever.
    again = tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    _train(again, model, model, optimizer, steps=1)
    again.close()
    assert watch_steps(again)[0]["finite"]["forward"] is True


@pytest.mark.parametrize("strict", [False, True])
def test_a_watched_model_exports_with_torch_export_as_it_would_unwatched(
    strict: bool, run_root: Path, socket_dir: Path
):
    # A strict export is dynamo's one graph: the hook's graph break raised there too.
    model, _, watch = _watched_mlp(run_root)
    x = torch.randn(5, 2)
    with dynamo_counted():
        program = torch.export.export(model, (x,), strict=strict)
    ops = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert ops == [torch.ops.aten.linear.default, torch.ops.aten.relu.default, torch.ops.aten.linear.default]
    assert torch.equal(program.module()(x), model(x))
    watch.close()
