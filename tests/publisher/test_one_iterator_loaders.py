"""A loader whose one torch iterator serves every epoch still gives each step its own sample ids.

YOLOv5's and Ultralytics' ``InfiniteDataLoader`` (and timm's ``MultiEpochsDataLoader``) make
``super().__iter__()`` once, in their ``__init__``, over a sampler repeated for ever, and their ``__iter__``
hands out ``len(self)`` of its batches: so that the workers are not started again each epoch. That iterator was
made before the Watch, with the loader's own sampler: ``watch.batches(loader)`` recorded no ids at all.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch
from tuiwatch.publisher.loader import record_draws

from ..helpers import watch_steps
from .loops import train_on


class _RepeatSampler:
    def __init__(self, sampler: Any):
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield from iter(self.sampler)


class InfiniteDataLoader(DataLoader[Any]):
    """YOLOv5's (utils/dataloaders.py), as published."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
        self.iterator = super().__iter__()

    def __len__(self) -> int:
        return len(self.batch_sampler.sampler)  # type: ignore[union-attr]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # (a generator, as theirs is)
        for _ in range(len(self)):
            yield next(self.iterator)


@contextlib.contextmanager
def workers_stopped(loader: InfiniteDataLoader) -> Iterator[None]:
    """Its workers stopped at the end, as Ultralytics' ``__del__`` does: an iterator that never ends keeps them
    until the process exits, which then waits for them."""
    try:
        yield
    finally:
        stop = getattr(loader.iterator, "_shutdown_workers", None)
        if stop is not None:
            stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_each_step_of_every_epoch_has_its_own_batchs_ids(run_root: Path, workers: int):
    x = torch.randn(48, 4)
    x[:, 0] = torch.arange(48)  # a sample's input says which it is
    data = TensorDataset(x, torch.randint(0, 2, (48,)))
    loader = InfiniteDataLoader(data, batch_size=8, shuffle=True, num_workers=workers)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[int]] = []
    with tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch, workers_stopped(loader):
        for epoch in range(3):
            if epoch == 2:
                next(loader.iterator)  # a batch taken outside the loop (a plot of one, say): no step's
            for inputs, labels in watch.batches(loader):
                seen.append(inputs[:, 0].long().tolist())
                loss = nn.functional.cross_entropy(model(inputs), labels)
                watch.log(loss=loss)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    steps = watch_steps(watch)
    assert len(steps) == len(seen) == 18
    assert [s["epoch"] for s in steps] == [0] * 6 + [1] * 6 + [2] * 6
    # The workers had drawn 2 × 2 batches ahead before the Watch: theirs are not known, and none are guessed.
    unknown = 4 if workers else 0
    assert [s["batch_ids"] for s in steps] == [None] * unknown + seen[unknown:]


@pytest.mark.parametrize("adapter", ["tqdm", "timm"])
def test_under_a_progress_bar_or_timms_prefetcher_it_trains_with_no_ids_guessed(run_root: Path, adapter: str):
    # The adapters' recorder stood in for the loader's batch sampler for the whole epoch, and the loader's own
    # __len__ reads batch_sampler.sampler: the recorder's own sampler (the _RepeatSampler, which has no len())
    # answered, and the run failed at its first batch with a TypeError.
    tqdm = pytest.importorskip("tqdm")
    from .test_progress_bars import PrefetchLoader

    x = torch.randn(32, 4)
    loader = InfiniteDataLoader(TensorDataset(x, torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)
    wrap = {"tqdm": lambda: tqdm.tqdm(loader, disable=True), "timm": lambda: PrefetchLoader(loader)}[adapter]
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(2):
            train_on(watch, model, optimizer, wrap())
    steps = watch_steps(watch)
    assert [s["epoch"] for s in steps] == [0] * 4 + [1] * 4
    assert [s["batch_ids"] for s in steps] == [None] * 8  # drawn by an iterator the adapter's recorder is not in


def test_a_draw_recorder_kept_by_its_iterator_lets_both_go():
    # tuiwatch run keys each iterator's recorder to it in a WeakKeyDictionary: a recorder holding its iterator
    # strongly kept the iterator, and with it the loader's workers, for as long as the run's hooks lived.
    loader = InfiniteDataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)
    recorder = record_draws(loader.iterator)
    assert recorder is not None
    kept: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary({loader.iterator: recorder})
    iterator = weakref.ref(loader.iterator)
    next(iter(loader))
    del loader, recorder
    gc.collect()
    assert iterator() is None
    assert len(kept) == 0
