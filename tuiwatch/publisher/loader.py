"""Which sample ids each batch of a DataLoader holds.

A DataLoader iterator draws indices from its index sampler, and with
``num_workers > 0`` it draws several batches ahead inside ``iter()`` itself.
So the recorder must be in place while the iterator is built: the loader's
sampler attribute is swapped for the duration of ``iter(loader)`` only, and the
iterator keeps the recorder. Batches come out in sampling order (``in_order``),
so the ids of the next batch are the oldest recorded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any


class IndexRecorder:
    """Wraps an index sampler and remembers what it yielded, oldest first."""

    def __init__(self, sampler: Iterable[Any]):
        self.sampler = sampler
        self.ids: deque[list[int]] = deque()

    def __iter__(self) -> Iterator[Any]:
        self.ids.clear()  # a new epoch (persistent workers reuse the iterator)
        for item in self.sampler:
            self.ids.append(_as_id_list(item))
            yield item

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def pop(self) -> list[int] | None:
        return self.ids.popleft() if self.ids else None


def _as_id_list(item: Any) -> list[int]:
    if type(item) is list:
        return item  # BatchSampler yields a fresh list of ints per batch
    if isinstance(item, int):
        return [item]
    try:
        return [int(i) for i in item]
    except (TypeError, ValueError):
        return []


def iter_with_ids(loader: Any) -> tuple[Iterator[Any], IndexRecorder | None]:
    """``iter(loader)`` and, for a map-style DataLoader that yields in order, its id recorder."""
    try:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _DatasetKind
    except ImportError:  # pragma: no cover - torch is there in the publisher
        return iter(loader), None
    if (
        not isinstance(loader, DataLoader)
        or loader._dataset_kind != _DatasetKind.Map
        or not getattr(loader, "in_order", True)
    ):
        return iter(loader), None
    existing = getattr(getattr(loader, "_iterator", None), "_index_sampler", None)
    if isinstance(existing, IndexRecorder):  # persistent workers: the recorder is already in
        return iter(loader), existing
    attr = "batch_sampler" if loader._auto_collation else "sampler"
    original = getattr(loader, attr)
    recorder = IndexRecorder(original)
    # DataLoader.__setattr__ forbids this after init; the swap lasts only for iter().
    object.__setattr__(loader, attr, recorder)
    try:
        it = iter(loader)
    finally:
        object.__setattr__(loader, attr, original)
    if getattr(it, "_index_sampler", None) is not recorder:
        return it, None
    return it, recorder
