"""The tensors inside a batch, a model output or a state dict: one walk over nested containers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, in order: inside lists, tuples (named too), mappings and a ``.logits``."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from tensors(v)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(getattr(obj, "logits", None), torch.Tensor):
        yield obj.logits
