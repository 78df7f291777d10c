"""torchdata's ``StatefulDataLoader``: a loader that saves its position mid-epoch and resumes there.

It saves and restores the position through its index sampler's iterator (``state_dict``/``load_state_dict``). The
Watch's id recorder stood in for that iterator as a generator, which has neither: a loader resumed under
``watch.batches()`` drew the rest of the epoch from a new order (other samples than without the Watch, some twice),
and every step's ids were those of batches skipped by the resume.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from tuiwatch.publisher.watch import Watch

from ..helpers import watch_steps

# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates: its warning, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

# Each sample's value is its index: a batch says which samples it holds.
DATA = torch.utils.data.TensorDataset(torch.arange(96).float().unsqueeze(1), torch.zeros(96, dtype=torch.long))


def _loader(workers: int, state: dict[str, Any] | None = None) -> StatefulDataLoader:
    loader = StatefulDataLoader(DATA, batch_size=8, shuffle=True, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def _rows(batch: Any) -> list[int]:
    return [int(v) for v in batch[0][:, 0]]


def _snapshot_after(loader: StatefulDataLoader, batches: int) -> dict[str, Any]:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state: dict[str, Any] = loader.state_dict()
    return state


def _watched(
    loader: StatefulDataLoader, run_root: Path, epochs: int = 1
) -> tuple[list[list[int]], list[Mapping[str, Any]]]:
    model = nn.Linear(1, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    drawn = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(epochs):
            for batch in watch.batches(loader):
                drawn.append(_rows(batch))
                loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
                watch.log(loss=loss)
                loss.backward()
                optimizer.step()
    return drawn, watch_steps(watch)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_resumed_mid_epoch_draws_what_it_draws_unwatched_and_each_step_has_its_ids(
    run_root: Path, workers: int
):
    torch.manual_seed(0)
    state = _snapshot_after(_loader(workers), 5)
    unwatched = [_rows(b) for b in _loader(workers, state)]
    assert len(unwatched) == 7  # the epoch's 12 batches less the 5 drawn before the snapshot
    drawn, steps = _watched(_loader(workers, state), run_root)
    assert drawn == unwatched
    assert [s["batch_ids"] for s in steps] == drawn


def test_a_snapshot_taken_under_the_watch_resumes_where_the_watched_epoch_went_on(run_root: Path):
    torch.manual_seed(0)
    loader = _loader(0)
    model = nn.Linear(1, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    drawn = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for i, batch in enumerate(watch.batches(loader)):
            drawn.append(_rows(batch))
            loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            if i == 4:
                state = loader.state_dict()
    assert [_rows(b) for b in _loader(0, state)] == drawn[5:]


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_every_epoch_of_a_loader_has_its_ids(run_root: Path, workers: int, persistent: bool):
    # The loader keeps its last iterator (for its state_dict) with or without persistent workers, and makes a new one
    # each epoch without them: that one was taken for a persistent workers' iterator, whose recorder is in already,
    # and the second epoch's steps had no ids.
    torch.manual_seed(0)
    loader = StatefulDataLoader(DATA, batch_size=8, shuffle=True, num_workers=workers, persistent_workers=persistent)
    drawn, steps = _watched(loader, run_root, epochs=2)
    assert len(drawn) == 24
    assert sorted(i for rows in drawn[12:] for i in rows) == list(range(96))  # the second epoch, whole
    assert [s["batch_ids"] for s in steps] == drawn


class Shuffled(torch.utils.data.Sampler[int]):
    """A sampler of one's own, with no state to save: a StatefulDataLoader resumes over it (under torch's
    BatchSampler) by drawing the epoch again and skipping the batches it had handed out."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(7)).tolist())

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_resumed_over_a_sampler_without_state_has_each_steps_own_ids(run_root: Path, workers: int):
    # The batches it skips to get back to its position were drawn through the recorder: their ids came first, and
    # each step had the ids of a batch five before its own.
    def loader(state: dict[str, Any] | None = None) -> StatefulDataLoader:
        batches = torch.utils.data.BatchSampler(Shuffled(96), 8, drop_last=False)  # torch's: no state either
        made = StatefulDataLoader(DATA, batch_sampler=batches, num_workers=workers)
        if state is not None:
            made.load_state_dict(state)
        return made

    state = _snapshot_after(loader(), 5)
    unwatched = [_rows(b) for b in loader(state)]
    assert len(unwatched) == 7
    drawn, steps = _watched(loader(state), run_root)
    assert drawn == unwatched
    assert [s["batch_ids"] for s in steps] == drawn


def test_accelerate_resumed_mid_epoch_with_its_stateful_loader_has_each_steps_own_ids(run_root: Path, tmp_path: Path):
    # Accelerate's use_stateful_dataloader: save_state mid-epoch, then load_state in a new Accelerator. Its loader
    # resumes over torch's samplers, which have no state: the batches skipped were recorded first.
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    def prepared() -> tuple[Any, nn.Module, torch.optim.Optimizer, Any]:
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        model = nn.Linear(1, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        loader = torch.utils.data.DataLoader(DATA, batch_size=8, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        return accelerator, model, optimizer, loader

    torch.manual_seed(0)
    accelerator, model, optimizer, loader = prepared()
    for i, _ in enumerate(loader):
        if i == 4:
            accelerator.save_state(str(tmp_path / "state"))
            break
    accelerator, model, optimizer, loader = prepared()
    accelerator.load_state(str(tmp_path / "state"))
    drawn = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(loader):
            drawn.append([int(v) for v in x[:, 0]])
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            accelerator.backward(loss)
            optimizer.step()
    steps = watch_steps(watch)
    assert len(drawn) == 7
    assert [s["batch_ids"] for s in steps] == drawn


def test_a_loader_resumed_over_a_sampler_with_a_state_of_its_own_has_each_steps_own_ids(run_root: Path):
    # Without batching (batch_size=None) the recorder stands in for the sampler itself: one with a state of its own
    # is restored, not fast-forwarded, and none of its draws may be taken for the skipped ones.
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    def loader(state: dict[str, Any] | None = None) -> StatefulDataLoader:
        sampler = StatefulDistributedSampler(DATA, num_replicas=1, rank=0, shuffle=True, seed=3)
        made = StatefulDataLoader(DATA, batch_size=None, sampler=sampler)
        if state is not None:
            made.load_state_dict(state)
        return made

    state = _snapshot_after(loader(), 5)
    unwatched = [int(b[0][0]) for b in loader(state)]
    assert len(unwatched) == 91
    model = nn.Linear(1, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    drawn = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(loader(state)):
            drawn.append(int(x[0]))
            loss = nn.functional.cross_entropy(model(x.unsqueeze(0)), y.unsqueeze(0))
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
    assert drawn == unwatched
    assert [s["batch_ids"] for s in watch_steps(watch)] == [[i] for i in drawn]


def test_the_recorder_and_its_iterator_are_stateful_to_pythons_protocol_check_where_the_sampler_is():
    # torchdata asks isinstance(x, Stateful), a runtime-checkable protocol, which from Python 3.12 on looks the
    # methods up as inspect.getattr_static does: not through __getattr__. Reached only that way, the sampler's state
    # was neither saved nor restored on 3.12 and 3.13, and a resumed loader drew another order under the Watch.
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler
    from torchdata.stateful_dataloader.stateful import Stateful

    from tuiwatch.publisher.loader import index_recorder

    def own(thing: Any) -> bool:
        return all(callable(inspect.getattr_static(thing, name, None)) for name in ("state_dict", "load_state_dict"))

    sampler = index_recorder(StatefulDistributedSampler(DATA, num_replicas=1, rank=0), batches=False)
    batches = index_recorder(StatefulDataLoader(DATA, batch_size=8, shuffle=True).batch_sampler, batches=True)
    for stateful in (sampler, iter(batches)):  # (a sampler that has a state; a batch sampler whose iterator has)
        assert own(stateful)
        assert isinstance(stateful, Stateful)
    plain = index_recorder(torch.utils.data.BatchSampler(range(96), 8, drop_last=False), batches=True)
    assert not own(plain)
    assert not own(iter(plain))
    assert next(iter(plain)) == list(range(8))  # (recording as before)
