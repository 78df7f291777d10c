"""The loop's own torch.nn.utils.clip_grad_norm_ gives the step its pre-clip norm, and nothing else changes; a
clip by value (clip_grad_value_) leaves it the norm measured before it.

``grad_norm`` is the norm before clipping (SPEC §3); a loop that clipped with
torch's function used to record the norm after it, measured in the optimizer's
pre-hook.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tuiwatch

# Held in a tuple: a Watch rebinds module-level names bound to torch's functions, these included.
ORIGINALS = (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_)


def steps_of(watch: tuiwatch.Watch) -> list[dict[str, object]]:
    assert watch.ledger_path is not None
    return [r for r in tuiwatch.read_ledger(watch.ledger_path) if r["kind"] == "step"]


def test_only_the_watched_models_clip_counts_and_torch_is_itself_again_after(run_root: Path):
    torch.manual_seed(0)
    model, other = nn.Linear(4, 2), nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    returned = []
    with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        assert torch.nn.utils.clip_grad_norm_ is not ORIGINALS[0]
        for x in watch.batches([torch.randn(8, 4) * 50 for _ in range(3)]):
            (model(x).pow(2).mean() + other(x).pow(2).mean()).backward()
            torch.nn.utils.clip_grad_norm_(other.parameters(), 0.5)  # not the watched model's: ignored
            returned.append(float(torch.nn.utils.clip_grad_norm_((p for p in model.parameters()), 1.0)))
            opt.step()
            opt.zero_grad()
            other.zero_grad()
    assert torch.nn.utils.clip_grad_norm_ is ORIGINALS[0]
    steps = steps_of(watch)
    assert [s["grad_norm"] for s in steps] == returned  # a generator of parameters, read once, still counted
    assert all(s["grad_norm_clipped"] is True for s in steps)


def test_torchs_answer_and_errors_reach_the_loop_unchanged(run_root: Path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True, on_nonfinite="warn"):
        model(torch.ones(1, 2)).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        inf_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3, norm_type=float("inf"))
        assert float(inf_norm) == max(float(g.abs().max()) for g in grads)  # other norms: torch's, not recorded
        for p in model.parameters():
            assert p.grad is not None
            p.grad.fill_(float("nan"))
        with pytest.raises(RuntimeError, match="non-finite"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)


def test_a_clip_over_the_trainable_part_of_a_partly_frozen_model_counts(run_root: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)  # fine-tuning the head only: the model's first parameter is frozen
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.01)
    with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for x in watch.batches([torch.randn(8, 4) * 50]):
            model(x).pow(2).mean().backward()
            returned = float(torch.nn.utils.clip_grad_norm_(trainable, 1e-3))
            opt.step()
    (step,) = steps_of(watch)
    assert (step["grad_norm"], step["grad_norm_clipped"]) == (returned, True)


def test_a_reference_kept_past_the_watch_and_a_wrapper_over_ours_still_clip(run_root: Path):
    model = nn.Linear(2, 1)
    with tuiwatch.Watch(model, run_dir=run_root, system=False, quiet=True):
        kept = torch.nn.utils.clip_grad_norm_  # a loop that bound the function while a Watch was open

        def theirs(*args: Any, **kwargs: Any) -> Any:  # another library wrapping it after us
            return kept(*args, **kwargs)

        torch.nn.utils.clip_grad_norm_ = theirs  # type: ignore[assignment]
    try:
        assert torch.nn.utils.clip_grad_norm_ is theirs  # theirs is left alone
        model(torch.ones(1, 2)).sum().backward()
        assert float(kept(model.parameters(), 1.0)) > 0
        with tuiwatch.Watch(model, run_dir=run_root, system=False, quiet=True):  # a second Watch: no loop
            assert float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) > 0
    finally:
        torch.nn.utils.clip_grad_norm_ = ORIGINALS[0]
    with tuiwatch.Watch(model, run_dir=run_root, system=False, quiet=True):  # theirs gone: wrapped again
        assert torch.nn.utils.clip_grad_norm_ is not ORIGINALS[0]
    assert torch.nn.utils.clip_grad_norm_ is ORIGINALS[0]


ENGINE = """
from torch.nn.utils import clip_grad_norm_, clip_grad_value_  # bound before any Watch exists
from torch.nn.utils import clip_grad_norm_ as clip_grad_norm  # as public scripts often do
from torch.nn.utils.clip_grad import clip_grad_norm_ as clip  # the same function, from its own module

def train(watch, model, opt, batches, returned, how):
    clipping = {"name": clip_grad_norm_, "alias": clip_grad_norm, "module": clip}[how]
    for x in watch.batches(batches):
        model(x).pow(2).mean().backward()
        returned.append(float(clipping(model.parameters(), 1.0)))
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("how", ["name", "alias", "module"])
def test_a_loop_that_imported_the_clip_before_its_watch_records_the_norm_before_it(
    run_root: Path, monkeypatch: pytest.MonkeyPatch, how: str
):
    # The loop in a module of its own (an engine.py) that bound torch's function before the Watch put its wrapper
    # on torch.nn.utils: every step recorded the norm after clipping, 1.0 flat. Under its own name it was rebound
    # before; under another (``import clip_grad_norm_ as clip_grad_norm``) it was not.
    engine = types.ModuleType("engine_of_the_loop")
    monkeypatch.setitem(sys.modules, engine.__name__, engine)
    exec(ENGINE, engine.__dict__)  # noqa: S102 - a module of the loop's, as an import would make it
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    returned: list[float] = []
    with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        engine.train(watch, model, opt, [torch.randn(8, 4) * 50 for _ in range(3)], returned, how)
    steps = steps_of(watch)
    assert min(returned) > 10
    assert [s["grad_norm"] for s in steps] == returned
    assert [s["grad_norm_clipped"] for s in steps] == [True] * 3
    assert torch.nn.utils.clip_grad_norm_ is ORIGINALS[0]  # torch's own is back; the loop's names keep the wrapper
    assert torch.nn.utils.clip_grad.clip_grad_norm_ is ORIGINALS[0]
    assert ORIGINALS[0] not in (engine.clip_grad_norm_, engine.clip_grad_norm, engine.clip)
    assert engine.clip_grad_value_ is not ORIGINALS[1]
    model(torch.ones(1, 4)).sum().backward()
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    assert float(engine.clip_grad_norm_(model.parameters(), 1.0)) == norm  # torch's answer, no Watch open


def test_torchs_deprecated_clip_grad_norm_and_a_clip_imported_from_its_module_inside_the_loop_count(run_root: Path):
    # torch.nn.utils.clip_grad_norm (no underscore, deprecated, still in old scripts) calls clip_grad_norm_ through
    # torch.nn.utils.clip_grad, and a loop may import from there once its Watch is open: both reached torch's own.
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    returned = []
    with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for i, x in enumerate(watch.batches([torch.randn(8, 4) * 50 for _ in range(4)])):
            model(x).pow(2).mean().backward()
            if i % 2:
                from torch.nn.utils.clip_grad import clip_grad_norm_

                returned.append(float(clip_grad_norm_(model.parameters(), 1.0)))
            else:
                with pytest.warns(FutureWarning, match="deprecated"):
                    returned.append(float(torch.nn.utils.clip_grad_norm(model.parameters(), 1.0)))
            opt.step()
            opt.zero_grad()
    steps = steps_of(watch)
    assert min(returned) > 10
    assert [s["grad_norm"] for s in steps] == returned
    assert [s["grad_norm_clipped"] for s in steps] == [True] * 4
    assert torch.nn.utils.clip_grad.clip_grad_norm_ is ORIGINALS[0]


def test_a_clip_by_value_leaves_the_step_the_norm_from_before_it(run_root: Path):
    """clip_grad_value_ computes no norm: measured after it (at the optimizer step), a gradient of 50 per element
    clipped to 0.25 read as a calm norm of 0.25·√n."""
    torch.manual_seed(0)
    model, other = nn.Linear(4, 2), nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before, after = [], []
    with tuiwatch.Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        assert torch.nn.utils.clip_grad_value_ is not ORIGINALS[1]
        for x in watch.batches([torch.randn(8, 4) * 50 for _ in range(3)]):
            (model(x).pow(2).mean() + other(x).pow(2).mean()).backward()
            torch.nn.utils.clip_grad_value_(other.parameters(), 0.1)  # not the watched model's: no norm of ours
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            before.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))
            torch.nn.utils.clip_grad_value_((p for p in model.parameters()), 0.25)  # a generator: read once
            clipped = [p.grad for p in model.parameters() if p.grad is not None]
            assert all(torch.equal(c, g.clamp(-0.25, 0.25)) for c, g in zip(clipped, grads, strict=True))  # torch's
            after.append(float(torch.linalg.vector_norm(torch.cat([c.flatten() for c in clipped]))))
            opt.step()
            opt.zero_grad()
            other.zero_grad()
    assert torch.nn.utils.clip_grad_value_ is ORIGINALS[1]
    steps = steps_of(watch)
    assert [s["grad_norm"] for s in steps] == pytest.approx(before, rel=1e-6)
    assert all(a < b / 10 for a, b in zip(after, before, strict=True))  # what the step used to record
    assert [s["grad_norm_clipped"] for s in steps] == [None] * 3  # no norm bound was set


def test_fabrics_clip_by_value_in_its_language_model_example(run_root: Path):
    """Lightning's Fabric example (examples/fabric/language_model) clips with ``fabric.clip_gradients(model,
    optimizer, clip_val=0.25)``, which calls torch's clip_grad_value_."""
    L = pytest.importorskip("lightning")
    torch.manual_seed(0)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    norms = []
    with tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for x in watch.batches([torch.randn(8, 4) * 30 for _ in range(3)]):
            loss = nn.functional.cross_entropy(model(x), torch.zeros(8, dtype=torch.long))
            watch.log(loss=loss)
            fabric.backward(loss)
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            fabric.clip_gradients(model, optimizer, clip_val=0.25)
            optimizer.step()
            optimizer.zero_grad()
    assert [s["grad_norm"] for s in steps_of(watch)] == pytest.approx(norms, rel=1e-6)
