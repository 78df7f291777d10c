"""``optimizer.step(closure)``: the step's gradients are made inside the step, by the closure's first call.

LBFGS calls its closure up to ``max_iter`` times a step, SAM-style optimizers
twice, SGD or Adam given one once; the first call is always at the weights the
step starts from, before any update. So what a step measures of its gradients
(the pre-clip norm, the non-finite check that must come before the update) is
measured when that first call returns, and what ``tuiwatch run`` records as
the loss is what that call backpropagated. An optimizer step pre-hook sees the
closure and may return it wrapped (torch calls the step with what a pre-hook
returns); in a step hook ``args`` starts with the optimizer itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def step_closure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any] | None:
    """The closure an optimizer step was given, or None (the usual ``optimizer.step()``)."""
    closure = args[1] if len(args) > 1 else kwargs.get("closure") if kwargs else None
    return closure if callable(closure) else None


def with_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], closure: Callable[[], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The step's arguments with ``closure`` where the given one was (what a step pre-hook returns)."""
    if len(args) > 1:
        return (args[0], closure, *args[2:]), kwargs
    return args, {**kwargs, "closure": closure}


def after_first_call(closure: Callable[[], Any], then: Callable[[], None]) -> Callable[[], Any]:
    """``closure``, calling ``then()`` once its first call has returned (later calls are the closure's alone)."""
    first = True

    def closure_then() -> Any:
        nonlocal first
        result = closure()
        if first:
            first = False
            then()
        return result

    return closure_then
