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
    elif (named := fields_of(obj)) is not None:
        for v in named.values():
            yield from tensors(v)
    elif isinstance(getattr(obj, "logits", None), torch.Tensor):
        yield obj.logits


def fields_of(obj: Any) -> dict[str, Any] | None:
    """A dataclass instance's fields by name (a batch or output class of one's own); None for anything else."""
    if not hasattr(type(obj), "__dataclass_fields__") or isinstance(obj, type):
        return None
    return {f.name: getattr(obj, f.name, None) for f in fields(obj)}
