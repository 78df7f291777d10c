"""A watched model scripts as if it were not watched: ``torch.jit.script`` leaves the Watch's hooks out.

TorchScript compiles a module's forward hooks and pre-hooks with its forward
(torch/jit/_recursive.py reads ``_forward_hooks`` and ``_forward_pre_hooks``),
and tuiwatch's hooks are Python it cannot compile: ``torch.jit.script(model)``
raised ``AttributeError: 'ForwardHook' object has no attribute '__name__'``
while a Watch was attached. Under ``tuiwatch run`` that is until the script
ends, so a script that saved its scripted model last lost the export after
training. Once a Watch has hooked a model, torch's ``create_script_module``
(what every ``torch.jit.script`` and ``torch.jit.freeze`` of a module goes
through, found through its module whatever name the caller imported) is
wrapped: for the call's duration, each module of the scripted tree that holds
one of our hooks has its hook tables replaced by copies without it, and the
originals are put back after, whatever happens. A scripted model holds nothing
of tuiwatch and is not watched, as a copy is not (pickling.py). The wrapper
stays for the process's life: with no watched model in the tree it changes
nothing.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from tuiwatch.publisher.forksafe import ForkSafeLock

# The tables TorchScript compiles: an integration's pre-hook is left out as the Watch's forward hook is.
_TABLES = ("_forward_hooks", "_forward_pre_hooks")

_lock = ForkSafeLock()
_installed = False


def leave_out_of_scripts(is_ours: Callable[[Any], bool]) -> None:
    """From now on, ``torch.jit.script`` of a module tree leaves out the hooks ``is_ours`` recognises."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        try:
            import torch.jit._recursive as recursive
        except ImportError:  # pragma: no cover - a torch without TorchScript: nothing to script
            return
        original = getattr(recursive, "create_script_module", None)
        if original is None:  # pragma: no cover - another torch's internals: scripting stays as torch has it
            return
        recursive.create_script_module = _without_hooks(original, is_ours)


def _without_hooks(original: Callable[..., Any], is_ours: Callable[[Any], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_script_module(nn_module: Any, *args: Any, **kwargs: Any) -> Any:
        hidden: list[tuple[torch.nn.Module, str, Any]] = []
        with contextlib.suppress(Exception):  # whatever went wrong here, torch scripts the model as it is
            _hide(nn_module, is_ours, hidden)
        try:
            return original(nn_module, *args, **kwargs)
        finally:
            for module, name, table in reversed(hidden):
                module.__dict__[name] = table

    return create_script_module


def _hide(root: Any, is_ours: Callable[[Any], bool], hidden: list[tuple[torch.nn.Module, str, Any]]) -> None:
    """Replace the hook tables that hold one of ours, in ``root``'s tree, by copies without it; ``hidden`` holds
    what to put back."""
    if not isinstance(root, torch.nn.Module):
        return
    for module in root.modules():
        for name in _TABLES:
            table = module.__dict__.get(name)
            if table and any(is_ours(h) for h in table.values()):
                hidden.append((module, name, table))
                module.__dict__[name] = OrderedDict((k, h) for k, h in table.items() if not is_ours(h))
