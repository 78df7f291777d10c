"""Forwards that activation checkpointing (``torch.utils.checkpoint``) runs, told from the loop's own.

A checkpointed model or part runs its forward twice a step. The reentrant
kind (``use_reentrant=True``, long torch's default and still Hugging Face's)
runs it first inside an autograd ``Function``'s forward, where gradients are
off, and again inside the backward to rebuild what it did not keep; the
non-reentrant kind runs only the second one differently, inside the backward
too. The second is not a forward of the step: counted, it took the step's
phases away, a recomputed part's output set the class count (its width, not
the head's), and a loop that marks no steps opened each step in the backward,
after the loss it had logged. The first is a training forward although
gradients are off.

Both read torch's thread state: in_backward() costs ~55 ns a forward in a tight loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# The autograd node the engine is running on this thread, None outside a backward (private to torch, which uses it
# itself in torch.autograd.graph); a torch without it is taken as never inside one.
_autograd_node: Callable[[], Any] = getattr(torch._C, "_current_autograd_node", lambda: None)
_forward_grad_enabled: Callable[[], bool] = getattr(torch._C, "_is_fwd_grad_enabled", lambda: True)


def in_backward() -> bool:
    """Whether this thread is inside a backward: a forward run now is a checkpoint's recomputation."""
    return _autograd_node() is not None


def in_function_forward(args: Any) -> bool:
    """Whether a forward called with ``args`` while gradients are off runs inside an autograd ``Function``'s forward
    for the backward's sake (a reentrant checkpoint's first run): torch turns forward-mode gradients off there too,
    where ``no_grad`` leaves them on, and the input needs a gradient (a reentrant checkpoint gives the parameters
    none unless one does). An evaluation under ``no_grad`` or ``inference_mode`` has no such input."""
    if _forward_grad_enabled():
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
