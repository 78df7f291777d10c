"""``watch.batches(tqdm(loader))``: the DataLoader under a progress bar is still the one recorded.

A tqdm bar is no DataLoader: its batches had no sample ids, and a checkpoint did not hold the loader's own
shuffle generator. It hands its iterable's items on one by one, in order, as Fabric's loader does, and as timm's
``PrefetchLoader`` does one batch behind its drawing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import tqdm  # type: ignore[import-untyped]  # (transformers, a dev dependency, brings it; no stubs)
import tqdm.auto  # type: ignore[import-untyped]
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch
from tuiwatch.publisher.resume import epoch_rng, restore_epoch_rng


def numbered_loader(workers: int = 0) -> DataLoader[tuple[torch.Tensor, ...]]:
    x = torch.randn(64, 4)
    x[:, 0] = torch.arange(64)  # a sample's input says which it is
    data = TensorDataset(x, torch.randint(0, 2, (64,)))
    return DataLoader(data, batch_size=8, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(3))


class PrefetchLoader:
    """timm's (timm/data/loader.py), as it iterates on the CPU: the next batch is normalised before this one is
    handed over."""

    def __init__(self, loader: DataLoader[tuple[torch.Tensor, ...]]):
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        held = None
        for x, y in self.loader:
            x = x.to(torch.float32).sub_(0.5).div_(0.5)
            if held is not None:
                yield held
            held = x, y
        if held is not None:
            yield held


ADAPTERS = {
    "tqdm": lambda loader: tqdm.tqdm(loader, disable=True),
    "tqdm.auto": lambda loader: tqdm.auto.tqdm(loader, disable=True),
    "timm": PrefetchLoader,
}


@pytest.mark.parametrize(("adapter", "workers"), [("tqdm", 0), ("tqdm.auto", 2), ("timm", 2)])
def test_a_loader_under_an_adapter_records_each_steps_ids(run_root: Path, adapter: str, workers: int):
    loader = numbered_loader(workers)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[int]] = []
    shuffled = getattr(loader.batch_sampler, "sampler", None)
    assert shuffled is not None
    with tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(2):
            for x, y in watch.batches(ADAPTERS[adapter](loader)):
                # The recorder stands in for the batch sampler all epoch: what the loader's code reads through it
                # is still the loader's own.
                assert getattr(loader.batch_sampler, "sampler", None) is shuffled
                first = x[:, 0] * 0.5 + 0.5 if adapter == "timm" else x[:, 0]  # (timm's normalised)
                seen.append(first.round().long().tolist())
                loss = nn.functional.cross_entropy(model(x), y)
                watch.log(loss=loss)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    assert watch.ledger_path is not None
    steps = [r for r in tuiwatch.read_ledger(watch.ledger_path) if r["kind"] == "step"]
    assert [s["batch_ids"] for s in steps] == seen
    assert len(seen) == 16


def test_a_checkpoint_holds_the_shuffle_generator_of_the_loader_under_a_progress_bar():
    loader = numbered_loader()
    assert loader.generator is not None
    saved = epoch_rng(tqdm.tqdm(loader, disable=True))
    first = [x[:, 0].long().tolist() for x, _ in loader]
    restore_epoch_rng(saved, tqdm.tqdm(loader, disable=True))
    assert [x[:, 0].long().tolist() for x, _ in loader] == first  # the same shuffle again
