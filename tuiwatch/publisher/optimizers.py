"""Optimizers inside the wrappers of the libraries that train for the user."""

from __future__ import annotations

from typing import Any

import torch


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer that actually steps, under a wrapper that subclasses Optimizer without its state.

    Accelerate's ``AcceleratedOptimizer`` (``.optimizer``) forwards ``step()`` to the optimizer it wraps and has no
    hook tables of its own; Lightning's ``LightningOptimizer`` (``._optimizer``) copies the wrapped one's
    ``__dict__``, so it has them, and they are the wrapped one's tables. Either way the hooks go on the wrapped one,
    and the two are one optimizer (``tuiwatch run`` on a Lightning script found "Adam + LightningAdam", the same
    hooks put on twice).
    """
    for _ in range(4):  # a wrapper of a wrapper, at most a few deep
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        own = getattr(optimizer, "_optimizer_step_pre_hooks", None)
        if own is not None and own is not getattr(inner, "_optimizer_step_pre_hooks", None):
            break  # an optimizer of its own over another (a Lookahead): its own hooks run at its step
        optimizer = inner
    return optimizer


def as_list(optimizer: Any) -> list[Any]:
    """``Watch(model, optimizer)``'s second argument as a list: none, one, or several optimizers stepping one model
    (torch's ``Muon`` for the matrices beside ``AdamW`` for the rest, ``SparseAdam`` beside ``Adam``)."""
    if optimizer is None:
        return []
    return list(optimizer) if isinstance(optimizer, list | tuple) else [optimizer]


def optimizer_name(optimizer: Any) -> str:
    """``SGD``, ``SGD in AcceleratedOptimizer`` for a wrapped one, ``AdamW + Muon`` for several: what the run record
    says."""
    if isinstance(optimizer, list | tuple):
        return " + ".join(optimizer_name(o) for o in optimizer)
    inner = inner_optimizer(optimizer)
    name = type(inner).__name__
    return name if inner is optimizer else f"{name} in {type(optimizer).__name__}"


def params_of(optimizer: Any) -> list[torch.Tensor]:
    """The tensors an optimizer steps, every param group's, in order."""
    return [p for group in optimizer.param_groups for p in group["params"]]
