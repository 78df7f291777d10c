"""Whether a device has room for a passing copy: the update norm's copy of the weights must never be what runs a
training out of memory (the run sized its batch to fill the device)."""

from __future__ import annotations

from collections.abc import Iterable

import psutil
import torch

# The most of a device's spare memory the copy may take: what is left stays the run's own.
SHARE = 0.5


def spare_bytes(device: torch.device) -> int | None:
    """What a new allocation on ``device`` can take: the driver's free memory and what the caching allocator holds
    unused (CUDA), or the host's available memory (CPU); None where it cannot be told."""
    try:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)  # a driver query, no stream sync
            return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        if device.type == "cpu":
            return int(psutil.virtual_memory().available)
    except Exception:  # a device that cannot say: the copy is made as before
        return None
    return None


def has_room(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether a copy of ``tensors`` takes at most :data:`SHARE` of the spare memory of each device they are on."""
    need: dict[torch.device, int] = {}
    for t in tensors:
        need[t.device] = need.get(t.device, 0) + t.numel() * t.element_size()
    for device, size in need.items():
        spare = spare_bytes(device)
        if spare is not None and size > SHARE * spare:
            return False
    return True
