"""Values that live on the device until the background thread can read them without a sync.

On the training thread :func:`defer` only detaches (CPU) or starts a
non-blocking copy into pinned host memory and records a CUDA event. The
pipeline thread asks :func:`is_ready` (``event.query()``, no sync) and then
:func:`resolve` turns the value into a Python number.
"""

from __future__ import annotations

from typing import Any

import torch


class PendingCopy:
    """A device scalar being copied to pinned host memory."""

    __slots__ = ("event", "host")

    def __init__(self, host: torch.Tensor, event: Any):
        self.host = host
        self.event = event


def defer(t: torch.Tensor) -> Any:
    t = t.detach()
    if t.device.type != "cuda":
        if t.device.type != "cpu":
            return t.cpu()
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return PendingCopy(host, event)


def is_ready(value: Any) -> bool:
    return not isinstance(value, PendingCopy) or bool(value.event.query())


def resolve(value: Any) -> Any:
    """A deferred value (or a list of them) as Python numbers; other values unchanged."""
    if isinstance(value, PendingCopy):
        value.event.synchronize()  # no-op once query() said ready; blocks only at close
        value = value.host
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, list):
        return [resolve(v) for v in value]
    return value
