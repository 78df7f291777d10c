"""The sample ids of each batch a prepared loader hands a framework, found again at the model's forward.

The Hugging Face Trainer iterates Accelerate's ``DataLoaderShard`` itself, draws
a whole accumulation window before the window's first forward, and Accelerate
draws one batch ahead of what it hands over: neither the draws nor the steps
say which ids the next forward trains on. The batch does: while the Trainer
trains, the loader's ``__iter__`` is wrapped for that one loader (its DataLoader
gets an id recorder, as ``watch.batches()`` gives one), and each batch it hands
over is remembered with its ids by its first tensor. A forward whose first
input is that very tensor object (the Trainer moves a batch that is already on
its device without copying it) gets them; a second forward of the same batch
(a loss that runs the model twice), a batch that was copied, or a loader that
skips its first batches (resuming mid-epoch: a new loader object) get none,
never another batch's.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tuiwatch.integrations.loss import wrap_attribute
from tuiwatch.publisher.loader import adapter_with_ids, ids_of_size
from tuiwatch.publisher.measure import batch_size, first_tensor

# Batches handed over and not yet seen at a forward: an accumulation window and the one drawn ahead, with room.
KEPT = 64


class HandedIds:
    def __init__(self, loader: Any):
        self.loader = loader
        self._handed: deque[tuple[weakref.ref[Any], list[int] | None]] = deque(maxlen=KEPT)
        owner = next((c for c in type(loader).__mro__ if "__iter__" in c.__dict__), None)
        self._undo: Callable[[], None] | None = None
        if owner is not None and owner is not object:
            self._undo = wrap_attribute(owner, "__iter__", self._iter)

    def remove(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None
        self._handed.clear()

    def _iter(self, original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        def __iter__(loader: Any) -> Iterator[Any]:
            if loader is not self.loader:
                return original(loader)
            try:
                handed = adapter_with_ids(loader, original)
            except Exception:  # a loader the recorder cannot stand in for: trained on all the same, without ids
                handed = None
            return original(loader) if handed is None else self._remembered(*handed)

        return __iter__

    def _remembered(self, batches: Iterator[Any], recorder: Any) -> Iterator[Any]:
        for batch in batches:
            ids = recorder.pop()
            first = first_tensor(batch)
            if first is not None:
                self._handed.append((weakref.ref(first), ids))
            yield batch

    def take(self, inputs: Any) -> list[int] | None:
        """The ids of the handed batch whose first tensor ``inputs`` starts with, once; None if there is none."""
        first = first_tensor(inputs)
        if first is None:
            return None
        size = batch_size(first)
        handed = self._handed
        for index, (ref, ids) in enumerate(handed):
            if ref() is first:
                for _ in range(index + 1):  # this one, and those handed before it that no forward took
                    handed.popleft()
                return ids_of_size(ids, size)
        return None
