"""The tensors inside a batch, a model output or a state dict: one walk over nested containers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

import torch


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, in order: inside lists, tuples (named too), mappings, dataclasses and a ``.logits``."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from tensors(v)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors(v)
    elif is_dataclass_instance(obj):
        for f in fields(obj):
            yield from tensors(getattr(obj, f.name, None))
    elif isinstance(getattr(obj, "logits", None), torch.Tensor):
        yield obj.logits


def is_dataclass_instance(obj: Any) -> bool:
    """Whether ``obj`` is an instance of a dataclass (a batch class of one's own), not the class itself."""
    return hasattr(type(obj), "__dataclass_fields__") and not isinstance(obj, type)
