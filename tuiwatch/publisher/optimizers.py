"""Optimizers inside the wrappers of the libraries that train for the user."""

from __future__ import annotations

from typing import Any

import torch


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer that actually steps, under a wrapper that subclasses Optimizer without its state.

    Accelerate's ``AcceleratedOptimizer`` (``.optimizer``) and Lightning's
    ``LightningOptimizer`` (``._optimizer``) forward ``step()`` to the optimizer they
    wrap but have no hook tables of their own: the hooks go on the wrapped one.
    """
    for _ in range(4):  # a wrapper of a wrapper, at most a few deep
        if hasattr(optimizer, "_optimizer_step_pre_hooks"):
            return optimizer
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            break
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
