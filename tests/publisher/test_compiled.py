"""torch.compile around a watched model or its optimizer's step: what it compiles is what it would compile unwatched.

Dynamo traced tuiwatch's hooks where it met them: their clock reads and ``.item()`` split the compiled code into
more graphs, and dynamo wrote warnings about tuiwatch's lines into the run's output. The hooks are now
``torch.compiler.disable``d: they run as they are, between graphs. ``backend="eager"``: dynamo's tracing without
a C++ toolchain.
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
from tuiwatch.ledger.records import Record

from ..helpers import records


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


def _steps(watch: tuiwatch.Watch) -> list[Record]:
    assert watch.ledger_path is not None
    return records(watch.ledger_path, "step")


def test_a_model_compiled_after_the_watch_hooked_it_is_one_graph(run_root: Path, socket_dir: Path):
    # The Watch made before torch.compile, or a Trainer's torch_compile=True with its callback's pre-hook on the
    # model: three graphs instead of one.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 2, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(4)]
    with dynamo_counted() as counted:
        watch = tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
        compiled = cast(nn.Module, torch.compile(model, backend="eager"))
        for x, y in watch.batches(batches):
            loss = nn.functional.cross_entropy(compiled(x), y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        watch.close()
        assert counted() == (1, [])
    steps = _steps(watch)
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
    steps = _steps(watch)
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4]
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms, rel=1e-6)
    assert [s["lr"] for s in steps] == [[torch.tensor(0.01).item()]] * 4
    assert steps[0]["update_norm"] is not None
