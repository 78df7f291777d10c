"""A watched model stays a normal model: it pickles, copies, averages and compiles, and copies stay out of the run.

Written after pytorch/examples' word_language_model crashed at the end of its
first epoch on ``torch.save(model, f)`` with a Watch attached.
"""

from __future__ import annotations

import copy
import copyreg
import io
import pickle
from pathlib import Path
from typing import cast

import pytest
import torch
from torch import nn

import tuiwatch
from tuiwatch.publisher.hooks import ForwardHook

from ..helpers import watch_steps
from .loops import train_batches


def _watched(run_root: Path) -> tuple[nn.Module, torch.optim.Optimizer, tuiwatch.Watch]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False)


def test_a_watched_model_pickles_deep_copies_and_saves_whole(run_root: Path, socket_dir: Path):
    model, optimizer, watch = _watched(run_root)
    train_batches(watch, model, optimizer, 3)
    x = torch.randn(5, 2)
    saved = io.BytesIO()
    torch.save(model, saved)  # word_language_model's end of epoch
    saved.seek(0)
    copies = [
        pickle.loads(pickle.dumps(model)),  # noqa: S301 - the bytes this test just made
        copy.deepcopy(model),
        torch.load(saved, weights_only=False),
    ]
    for clone in copies:
        assert torch.equal(clone(x), model(x))
    restored = pickle.loads(pickle.dumps(optimizer))  # noqa: S301 - the bytes this test just made
    assert restored.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    train_batches(watch, model, optimizer, 2)  # the run goes on as before
    watch.close()
    assert [s["step"] for s in watch_steps(watch)] == [0, 1, 2, 3, 4]


def test_an_integrations_forward_pre_hook_stays_out_of_copies_and_the_users_stays_in(run_root: Path, socket_dir: Path):
    model, _, watch = _watched(run_root)
    seen: list[object] = []

    def before_forward(module: nn.Module, args: object, kwargs: object) -> None:
        seen.append(kwargs)

    # What the Trainer callback registers: a ForwardHook (it holds its target weakly) as a pre-hook with kwargs.
    ours = model.register_forward_pre_hook(ForwardHook(before_forward), with_kwargs=True)
    model.register_forward_pre_hook(users_pre_hook)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # noqa: S301 - bytes made here
        assert list(clone._forward_pre_hooks.values()) == [users_pre_hook]
        assert not clone._forward_pre_hooks_with_kwargs
        clone(torch.randn(1, 2))
    assert seen == []  # the copies never reached the integration's hook
    model(torch.randn(1, 2))
    assert len(seen) == 1  # the model's own hook is still there
    ours.remove()
    watch.close()


def users_pre_hook(module: nn.Module, args: object) -> None:
    """A forward pre-hook of the user's own."""


def users_hook(module: nn.Module, args: object, output: object) -> None:
    """A hook of the user's own, next to the Watch's."""


def test_a_saved_watched_model_holds_nothing_of_tuiwatch_and_loads_weights_only(run_root: Path, socket_dir: Path):
    # word_language_model reloads its best model with torch.load(weights_only=True) and safe_globals.
    model, optimizer, watch = _watched(run_root)
    train_batches(watch, model, optimizer, 2)
    saved = io.BytesIO()
    torch.save(model, saved)
    assert b"tuiwatch" not in saved.getvalue()
    saved.seek(0)
    with torch.serialization.safe_globals([nn.Sequential, nn.Linear, nn.ReLU]):
        loaded = torch.load(saved, weights_only=True)
    assert loaded._forward_hooks == {}
    assert loaded._forward_hooks_always_called == {}
    assert copy.deepcopy(model)._forward_hooks == {}
    assert len(model._forward_hooks) == 1  # the model itself keeps the Watch's hook
    # The user's own hook is the user's business: it is saved and copied as ever.
    model.register_forward_hook(users_hook)
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    assert list(torch.load(saved, weights_only=False)._forward_hooks.values()) == [users_hook]
    assert list(copy.deepcopy(model)._forward_hooks.values()) == [users_hook]
    watch.close()
    assert type(model) not in copyreg.dispatch_table  # closing puts pickling back as it was


def test_copies_of_a_watched_model_never_publish_into_its_run(run_root: Path, socket_dir: Path):
    model, optimizer, watch = _watched(run_root)
    ema = torch.optim.swa_utils.AveragedModel(model)  # an EMA/SWA copy, updated beside the model
    shallow = copy.copy(model)  # shares the model's hook table
    deep = copy.deepcopy(model)
    for x, y in watch.batches([(torch.full((4, 2), float("nan")), torch.zeros(4, dtype=torch.long))]):
        # Non-finite outputs from the copies: the step's forward probe must not see them.
        for clone in (ema, shallow, deep):
            clone(x)
        ok = torch.ones(4, 2)
        loss = nn.functional.cross_entropy(model(ok), y)
        watch.log(loss=loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.update_parameters(model)
    watch.close()
    (step,) = watch_steps(watch)
    assert step["finite"]["forward"] is True  # the model's own output, not a copy's
    assert step["finite"]["batch"] is False  # the batch the loader gave did hold NaN


def test_a_compiled_model_is_watched_under_its_own_class_name(run_root: Path, socket_dir: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = cast(nn.Module, torch.compile(model, backend="eager"))  # eager: no C++ toolchain needed
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    watch = tuiwatch.Watch(compiled, optimizer, run_dir=run_root, system=False)
    train_batches(watch, compiled, optimizer, 3)
    watch.close()
    assert watch.run_record["model"] == "Sequential"
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all(s["finite"]["forward"] is True and s["grad_norm"] > 0 for s in steps)


class NotScriptable(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.__class__.__name__.count("T")  # TorchScript has no __class__ of a tensor


def test_a_watched_model_scripts_without_the_watchs_hooks_and_stays_watched(run_root: Path, socket_dir: Path):
    # A script that saves torch.jit.script(model) after training raised in get_hook_stubs ('ForwardHook' object
    # has no attribute '__name__'): under tuiwatch run the Watch is attached until the script ends.
    model, optimizer, watch = _watched(run_root)
    train_batches(watch, model, optimizer, 2)
    ours = model.register_forward_pre_hook(ForwardHook(users_hook), with_kwargs=True)  # an integration's
    x = torch.randn(5, 2)
    scripted = torch.jit.script(model)
    assert torch.equal(scripted(x), model(x))
    saved = io.BytesIO()
    torch.jit.save(scripted, saved)
    assert b"tuiwatch" not in saved.getvalue()
    saved.seek(0)
    assert torch.equal(torch.jit.load(saved)(x), model(x))
    # The same inside a larger module, frozen, and through a name imported from torch.jit.
    from torch.jit import script

    wrapper = script(nn.Sequential(model, nn.ReLU()).eval())
    assert torch.equal(torch.jit.freeze(wrapper)(x), torch.relu(model(x)))
    # A module TorchScript refuses fails as torch has it fail, and the tables are put back all the same.
    with pytest.raises(RuntimeError, match="__class__"):
        torch.jit.script(nn.Sequential(model, NotScriptable()))
    assert [type(h) for h in model._forward_hooks.values()] == [ForwardHook]
    assert [type(h) for h in model._forward_pre_hooks.values()] == [ForwardHook]
    ours.remove()
    train_batches(watch, model, optimizer, 2)  # still watched: the forward probe is read at each step
    watch.close()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(s["finite"]["forward"] is True for s in steps)


@pytest.mark.parametrize("export", ["jit.trace", "export", "export-strict"])
def test_a_model_exported_in_the_middle_of_a_step_exports_and_the_step_is_recorded(
    export: str, run_root: Path, socket_dir: Path
):
    # An export at the top of the loop, the step's batch drawn and its forward to come. torch.jit.trace raised
    # "Tracing failed sanity checks" (the hook's probe was in its first trace only), and a non-strict
    # torch.export lost the step's record (the hook read the export's fake output as the step's).
    model, optimizer, watch = _watched(run_root)
    x = torch.randn(4, 2)
    exported: list[nn.Module] = []
    for i, (xb, y) in enumerate(watch.batches([(x, torch.zeros(4, dtype=torch.long))] * 3)):
        if i == 1:
            if export == "jit.trace":
                exported.append(torch.jit.trace(model, xb))
            else:
                exported.append(torch.export.export(model, (xb,), strict=export == "export-strict").module())
        loss = nn.functional.cross_entropy(model(xb), y)
        watch.log(loss=loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.allclose(exported[0](x), model(x))  # (the exported module holds the model's own parameters)
    watch.close()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all(s["finite"]["forward"] is True and s["grad_norm"] > 0 for s in steps)
