"""The norm before clipping, from the loop's own ``torch.nn.utils.clip_grad_norm_``.

A loop that clips with torch's function (directly, or through
``accelerator.clip_grad_norm_``, the Hugging Face Trainer or Lightning, which
all call it by its module attribute) has clipped before the optimizer's
pre-hook runs: measured there, ``grad_norm`` would be the norm after clipping.
While a Watch is open, ``torch.nn.utils.clip_grad_norm_`` and
``clip_grads_with_norm_`` (the second half of a clip whose norm was computed
apart, as Accelerate's is) are wrapped: the norm torch computed before it
clipped is the step's grad norm, and ``grad_norm_clipped`` follows from
``max_norm``. Nothing is computed
twice. ``clip_grad_value_`` (Lightning's ``gradient_clip_algorithm="value"``,
``fabric.clip_gradients(clip_val=...)``, Accelerate's) computes no norm: the
Watch measures the one it would have measured at the optimizer step just
before the clip instead, so it is still the norm before clipping (its
``grad_norm_clipped`` stays null: no norm bound was set). Only a call over the
watched model's parameters, with the 2-norm, counts; anything the wrapper does
itself is guarded, so the loop always gets torch's answer or torch's
exception. A loop that imported the function before the Watch started
(``from torch.nn.utils import clip_grad_norm_``, or ``... as clip``) has
that name rebound to the wrapper when the wrappers go on. torch's own
deprecated ``clip_grad_norm`` calls ``clip_grad_norm_`` through its module,
``torch.nn.utils.clip_grad``, which is wrapped as well.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils.clip_grad as clip_grad

from tuiwatch.publisher.forksafe import ForkSafeLock
from tuiwatch.publisher.measure import gradient_norm

_lock = ForkSafeLock()
_recorders: weakref.WeakSet[Any] = weakref.WeakSet()  # the open Watches' hooks (ModelHooks.clipped)
# The functions the wrappers call. Never emptied: a loop that kept a reference to a wrapper (``clip =
# torch.nn.utils.clip_grad_norm_`` while a Watch was open) still clips after the last Watch closed.
_originals: dict[str, Callable[..., Any]] = {}
_installed: set[str] = set()
# Wrapped over by someone else when the last Watch closed, so left in their chain: never wrapped again (the
# original taken then would be their wrapper, which calls ours: a loop).
_left_in_chain: set[str] = set()


def _tell(params: Any, norm: Any, max_norm: Any, norm_type: Any = 2.0) -> None:
    with contextlib.suppress(Exception):  # the loop gets torch's answer whatever happens here
        if type(norm) is not torch.Tensor or float(norm_type) != 2.0:
            return
        listed = [params] if isinstance(params, torch.Tensor) else params
        for hooks in list(_recorders):
            hooks.clipped(listed, norm, float(max_norm))


def _clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
    params = parameters if isinstance(parameters, torch.Tensor) else list(parameters)  # a generator, read once
    norm = _originals["clip_grad_norm_"](params, max_norm, *args, **kwargs)
    _tell(params, norm, max_norm, args[0] if args else kwargs.get("norm_type", 2.0))
    return norm


def _clip_grads_with_norm_(parameters: Any, max_norm: float, total_norm: Any, *args: Any, **kwargs: Any) -> Any:
    # The second half of a clip whose norm was computed apart (Accelerate's, DTensor-aware): that norm is the one.
    params = parameters if isinstance(parameters, torch.Tensor) else list(parameters)
    result = _originals["clip_grads_with_norm_"](params, max_norm, total_norm, *args, **kwargs)
    _tell(params, total_norm, max_norm)
    return result


def _clip_grad_value_(parameters: Any, clip_value: float, *args: Any, **kwargs: Any) -> Any:
    params = parameters if isinstance(parameters, torch.Tensor) else list(parameters)
    with contextlib.suppress(Exception):  # the loop's clip runs whatever happens here
        listed = [params] if isinstance(params, torch.Tensor) else params
        for hooks in list(_recorders):
            hooks.before_value_clip(listed)
    return _originals["clip_grad_value_"](params, clip_value, *args, **kwargs)


_WRAPPERS: dict[str, Callable[..., Any]] = {
    "clip_grad_norm_": _clip_grad_norm_,
    "clip_grads_with_norm_": _clip_grads_with_norm_,
    "clip_grad_value_": _clip_grad_value_,
}


def watch_clipping(hooks: Any) -> None:
    """Start handing ``hooks.clipped`` the norms of the loop's clips (the first Watch installs the wrappers)."""
    with _lock:
        _recorders.add(hooks)
        installing = False
        for name, wrapper in _WRAPPERS.items():
            current = getattr(torch.nn.utils, name, None)
            if name in _left_in_chain and current is _originals[name]:
                _left_in_chain.discard(name)  # the other wrapper is gone: torch's own function is back
            if name in _installed or current is None or current is wrapper or name in _left_in_chain:
                continue
            _originals[name] = current
            functools.update_wrapper(wrapper, current)  # its name, doc and signature stay torch's
            setattr(torch.nn.utils, name, wrapper)
            if getattr(clip_grad, name, None) is current:
                setattr(clip_grad, name, wrapper)
            _installed.add(name)
            installing = True
        if installing:
            with contextlib.suppress(Exception):  # never the Watch's failure: those clips stay after-clip readings
                _rebind_bound_originals()


def _rebind_bound_originals() -> None:
    """Names bound to torch's functions before the wrappers were on are bound to the wrappers.

    ``from torch.nn.utils import clip_grad_norm_`` at the top of a script runs before its Watch exists: the loop
    then called torch's own function, and every step's ``grad_norm`` was the norm after clipping (flat at
    ``max_norm``: ``grad-explosion`` could never fire). Rebound in every module but torch's (the loop may be in an
    ``engine.py`` the Watch was not made in), under whatever name holds the function: ``import clip_grad_norm_ as
    clip_grad_norm`` is as common in public scripts as the plain import. A reference kept under another name to
    compare with is rebound as well; the wrapper calls the same function with the same arguments and returns its
    answer, and still does after the last Watch closed. Once per install of the wrappers: ~5 ms with 3,300
    modules loaded (torch, Lightning, timm), a look at every module-level name.
    """
    wrappers = {id(_originals[name]): _WRAPPERS[name] for name in _installed}  # (the originals live: ids unique)
    for module_name, module in list(sys.modules.items()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict) or not _foreign(module_name):
            continue
        try:
            if wrappers.keys().isdisjoint(map(id, names.values())):  # (in C: most modules hold none)
                continue
            bound = [key for key, value in names.items() if id(value) in wrappers]
        except RuntimeError:  # another thread importing into this module meanwhile: its names are left as they are
            continue
        for key in bound:
            wrapper = wrappers.get(id(names.get(key)))
            if wrapper is not None:
                names[key] = wrapper


def _foreign(module_name: Any) -> bool:
    """A module of the loop's or a library's: not torch's (which defines and re-exports the functions) nor ours."""
    return (
        isinstance(module_name, str) and not module_name.startswith(("torch.", "tuiwatch.")) and module_name != "torch"
    )


class ClipBeforeTheWatch:
    """The loop's last clip while ``waiting()`` says its Watch is not made yet. ``tuiwatch run`` makes the Watch
    inside the first optimizer step, after the loop clipped, where its pre-hook would read the norm after clipping
    (1.0 for timm's ``--clip-grad 1``); given to the new Watch's hooks (``ModelHooks.clipped``), this clip's norm is
    that step's norm before clipping."""

    __slots__ = ("__weakref__", "last", "waiting")

    def __init__(self, waiting: Callable[[], bool]):
        self.waiting = waiting
        self.last: tuple[list[Any], Any, float | None] | None = None  # (parameters, norm, max_norm)

    def clipped(self, params: list[Any], norm: torch.Tensor, max_norm: float) -> None:
        if self.waiting():
            self.last = (params, norm, max_norm)

    def before_value_clip(self, params: list[Any]) -> None:
        if self.waiting():
            grads = [p.grad for p in params if isinstance(p, torch.Tensor) and p.grad is not None]
            self.last = (params, gradient_norm(grads), None)  # a value clip sets no norm bound

    def take(self) -> tuple[list[Any], Any, float | None] | None:
        last, self.last = self.last, None
        return last


def unwatch_clipping(hooks: Any) -> None:
    """Stop; the last Watch puts torch's functions back, unless someone else has wrapped one since. ``hooks`` None:
    a Watch collected unclosed, already gone from the recorders (a weak set)."""
    with _lock:
        if hooks is not None:
            _recorders.discard(hooks)
        if next(iter(_recorders), None) is not None:  # (not len(): it counts a collected one not removed yet)
            return
        for name in list(_installed):
            _installed.discard(name)
            if getattr(clip_grad, name, None) is _WRAPPERS[name]:
                setattr(clip_grad, name, _originals[name])
            if getattr(torch.nn.utils, name, None) is _WRAPPERS[name]:
                setattr(torch.nn.utils, name, _originals[name])
            else:
                _left_in_chain.add(name)
