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


def optimizer_name(optimizer: Any) -> str:
    """``SGD``, or ``SGD in AcceleratedOptimizer`` for a wrapped one: what the run record says."""
    inner = inner_optimizer(optimizer)
    name = type(inner).__name__
    return name if inner is optimizer else f"{name} in {type(optimizer).__name__}"
