"""A watched model pickles and copies as if it were not watched: the Watch's hook is left out of the copy.

The model's forward hook lives in its ``_forward_hooks`` table, which
``torch.save(model)``, ``pickle`` and ``copy.deepcopy`` copy with the model.
``ForwardHook`` alone copies as an inert hook, but it is still there: a model
saved that way then needs tuiwatch to load, and ``torch.load(weights_only=True)``
refuses it ("Unsupported global: tuiwatch…ForwardHook"), as pytorch/examples'
word_language_model does at its end. So, while a Watch is attached, the model's
class has a reducer in ``copyreg.dispatch_table`` (which ``pickle``,
``torch.save`` and ``copy.deepcopy`` consult before the class's own reduction):
it takes the class's own reduction and drops the Watch's hooks from the state.
Nothing of tuiwatch is in the bytes.
"""

from __future__ import annotations

import copyreg
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# The module attributes that hold forward (pre-)hooks, or their ids: an integration's pre-hook goes too.
_HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)

# class -> (what dispatch_table held for it before, how many Watches hide hooks on it)
_registered: dict[type, tuple[Callable[[Any], Any] | None, int]] = {}


def hide_hooks(cls: type, is_ours: Callable[[Any], bool]) -> None:
    """From now on, copies of ``cls`` instances leave out the hooks ``is_ours`` recognises."""
    previous, count = _registered.get(cls, (copyreg.dispatch_table.get(cls), 0))
    _registered[cls] = (previous, count + 1)
    if count == 0:
        copyreg.dispatch_table[cls] = _reducer(previous, is_ours)


def show_hooks(cls: type) -> None:
    """Undo one :func:`hide_hooks` (the last one puts back what was there)."""
    entry = _registered.get(cls)
    if entry is None:
        return
    previous, count = entry
    if count > 1:
        _registered[cls] = (previous, count - 1)
        return
    del _registered[cls]
    if previous is None:
        copyreg.dispatch_table.pop(cls, None)
    else:
        copyreg.dispatch_table[cls] = previous


def _reducer(previous: Callable[[Any], Any] | None, is_ours: Callable[[Any], bool]) -> Callable[[Any], Any]:
    def reduce_without_hooks(obj: Any) -> Any:
        reduced = previous(obj) if previous is not None else obj.__reduce_ex__(2)  # torch.save's protocol
        if not isinstance(reduced, tuple) or len(reduced) < 3 or not isinstance(reduced[2], dict):
            return reduced
        state = reduced[2]
        # Hook ids are unique across a module's tables (one counter): each table loses exactly ours.
        ours = {k for t in ("_forward_hooks", "_forward_pre_hooks") for k, h in state.get(t, {}).items() if is_ours(h)}
        if not ours:
            return reduced
        state = dict(state)  # the object's own __dict__: never changed
        for name in _HOOK_TABLES:
            table = state.get(name)
            if isinstance(table, dict):
                state[name] = OrderedDict((k, v) for k, v in table.items() if k not in ours)
            elif isinstance(table, set):
                state[name] = {k for k in table if k not in ours}
        return (*reduced[:2], state, *reduced[3:])

    return reduce_without_hooks
