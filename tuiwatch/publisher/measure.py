"""Measurements of one step: norms and what a batch looks like. All stay on the device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tuiwatch.publisher.deferred import defer


def total_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The 2-norm of all ``tensors`` together, as a device scalar (no sync)."""
    if not tensors:
        return None
    with torch.no_grad():
        norms = torch._foreach_norm(list(tensors))
        if len(norms) == 1:
            return norms[0]  # type: ignore[no-any-return]
        try:
            return torch.linalg.vector_norm(torch.stack(norms))  # type: ignore[no-any-return]
        except RuntimeError:
            # several devices or dtypes: torch's own grouping handles them
            return torch.nn.utils.get_total_norm(tensors, foreach=True)  # type: ignore[no-any-return]


def finiteness_probe(t: torch.Tensor) -> torch.Tensor:
    """A scalar that is finite iff every element of ``t`` is (one reduction kernel).

    A sum in float32 only overflows for sums beyond ~3e38, far outside what
    activations and inputs hold; a NaN or inf anywhere makes it non-finite.
    """
    return t.detach().sum(dtype=torch.float32)


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in a model output or batch: a tensor, a sequence, a mapping, or ``.logits``."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        for v in obj.values():
            if isinstance(v, torch.Tensor):
                return v
        return None
    if isinstance(obj, list | tuple):
        for v in obj:
            if isinstance(v, torch.Tensor):
                return v
        return None
    logits = getattr(obj, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def batch_shape(batch: Any) -> Any:
    """The batch with each tensor replaced by its shape (lists, dicts kept; other values null)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.shape)
    if isinstance(batch, list | tuple):
        return [batch_shape(v) for v in batch]
    if isinstance(batch, Mapping):
        return {str(k): batch_shape(v) for k, v in batch.items()}
    return None


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, list | tuple):
        return [t for v in batch for t in _tensors(v)]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    return []


class BatchInfo:
    """What the step record says about a batch, measured without a sync."""

    __slots__ = ("finite_probe", "shape", "size", "tokens")

    def __init__(self, batch: Any):
        self.shape = batch_shape(batch)
        tensors = _tensors(batch)
        self.size: int | None = int(tensors[0].shape[0]) if tensors and tensors[0].dim() else None
        floats = [t for t in tensors if t.is_floating_point()]
        self.finite_probe: Any = None
        if floats:
            probe = finiteness_probe(floats[0])
            for t in floats[1:]:
                probe = probe + finiteness_probe(t)
            self.finite_probe = defer(probe)
        self.tokens: Any = None
        if isinstance(batch, Mapping):
            mask = batch.get("attention_mask")
            if isinstance(mask, torch.Tensor):
                self.tokens = defer(mask.sum())
