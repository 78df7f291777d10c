"""The tensors inside a batch, a model output or a state dict: one walk over nested containers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

import torch


def tensors(obj: Any, arrays: bool = False) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, in order: inside lists, tuples (named too), mappings, dataclasses and a ``.logits``;
    with ``arrays``, its numpy arrays of numbers too, as tensors (copies)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from tensors(v, arrays)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors(v, arrays)
    elif (named := fields_of(obj)) is not None:
        for v in named.values():
            yield from tensors(v, arrays)
    elif arrays and (copy := array_as_tensor(obj)) is not None:
        yield copy
    elif isinstance(getattr(obj, "logits", None), torch.Tensor):
        yield obj.logits


def numpy_kind(obj: Any) -> str | None:
    """A numpy array's (or scalar's) dtype kind, told without importing numpy: "f" floats, "i" integers, "b"
    booleans, "U" text...; None for anything else."""
    if type(obj).__module__ != "numpy":
        return None
    kind = getattr(getattr(obj, "dtype", None), "kind", None)
    return kind if type(kind) is str else None


def array_as_tensor(obj: Any) -> torch.Tensor | None:
    """A numpy array of numbers (booleans, integers, floats) as a tensor of its own; None for anything else."""
    try:
        if numpy_kind(obj) in ("b", "i", "u", "f") and obj.ndim:
            return torch.tensor(obj)  # (a copy: torch.from_numpy warns of a read-only array, and shares its memory)
    except Exception:  # noqa: S110 - an array torch cannot hold: left as it is
        pass
    return None


def fields_of(obj: Any) -> dict[str, Any] | None:
    """A dataclass instance's fields by name (a batch or output class of one's own), or a PyTorch Geometric graph's
    attributes (its ``Data``, a loader's ``Batch`` of graphs, ``HeteroData``); None for anything else."""
    kind = type(obj)
    if hasattr(kind, "__dataclass_fields__") and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name, None) for f in fields(obj)}
    if is_graph_data(kind):
        try:
            # (HeteroData's attributes of no node or edge type are under "_global_store": most graphs have none)
            return {k: v for k, v in obj.to_dict().items() if k != "_global_store" or v}
        except Exception:  # a graph object of a version that reads otherwise: not walked
            return None
    return None


def is_graph_data(kind: type) -> bool:
    """Whether ``kind`` is PyTorch Geometric's graph data (a subclass of its ``BaseData``), told without importing
    it: its batches are neither sequences nor mappings, and were not walked (no shapes, finiteness or size)."""
    return any(c.__name__ == "BaseData" and c.__module__ == "torch_geometric.data.data" for c in kind.__mro__)
