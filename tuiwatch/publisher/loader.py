"""Which sample ids each batch of a DataLoader holds.

A DataLoader iterator draws indices from its index sampler, and with
``num_workers > 0`` it draws several batches ahead inside ``iter()`` itself.
So the recorder must be in place while the iterator is built: the loader's
sampler attribute is swapped for the duration of ``iter(loader)`` only, and the
iterator keeps the recorder. Batches come out in sampling order (``in_order``),
so the ids of the next batch are the oldest recorded.
"""

from __future__ import annotations

import inspect
import itertools
import operator
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class IndexRecorder:
    """Wraps an index sampler and remembers what it yielded, oldest first."""

    def __init__(self, sampler: Iterable[Any], *, batches: bool = True):
        # Not ``self.sampler``: a loader's code reads ``loader.batch_sampler.sampler`` (its BatchSampler's sampler;
        # YOLOv5's and timm's ``__len__``), which must stay what it was while the recorder stands in.
        self.recorded = sampler
        # A loader without batching (batch_size=None) asks its dataset for one key at a time: a tuple key is one
        # sample's ((shard, offset)), not several ids. A list is still read as ids: a dataset that fetches a whole
        # batch at once is given its indices as a list.
        self.batches = batches
        self.ids: deque[list[int] | None] = deque()

    def __iter__(self) -> Iterator[Any]:
        self.ids.clear()  # a new epoch (persistent workers reuse the iterator)
        inner, read = iter(self.recorded), _batch_ids if self.batches else _key_ids
        if _stateful(inner):  # a position to save and restore: it must be seen through (_Recording)
            return _Recording(inner, self.ids, read)
        # (A sampler with a state of its own is restored, not fast-forwarded, by the same caller.)
        skipped = 0 if _stateful(self.recorded) else _fast_forward(sys._getframe(1))
        return _recording(inner, self.ids.append, read, skipped)

    def __len__(self) -> int:
        return len(self.recorded)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Whatever else a loader asks of its sampler while the recorder stands in (a set_epoch, a seed) reaches
        # the real one: the recorder must never change what is drawn.
        if name == "recorded":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.recorded, name)

    def pop(self) -> list[int] | None:
        return self.ids.popleft() if self.ids else None


class _StatefulIndexRecorder(IndexRecorder):
    """The recorder of a sampler with a state of its own (torchdata's ``StatefulDistributedSampler``), which a
    ``StatefulDataLoader`` saves and restores: its two methods are the sampler's. They must be the class's own,
    not reached through ``__getattr__``: from Python 3.12 on, ``isinstance(x, Stateful)`` (a runtime-checkable
    protocol, as torchdata asks it) looks a method up without ``__getattr__``, and the sampler's state was
    neither saved nor restored."""

    def state_dict(self) -> Any:
        return self.recorded.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: Any) -> None:
        self.recorded.load_state_dict(state)  # type: ignore[attr-defined]


def index_recorder(sampler: Iterable[Any], *, batches: bool) -> IndexRecorder:
    """The :class:`IndexRecorder` of ``sampler``: one that has the sampler's state methods where it has them."""
    return (_StatefulIndexRecorder if _stateful(sampler) else IndexRecorder)(sampler, batches=batches)


def _stateful(thing: Any) -> bool:
    """Whether ``thing`` saves and restores a position (torchdata's ``Stateful``: both methods)."""
    return hasattr(thing, "state_dict") and hasattr(thing, "load_state_dict")


def _recording(
    inner: Iterator[Any], append: Callable[[Any], None], read: Callable[[Any], Any], skipped: int = 0
) -> Iterator[Any]:
    """The index sampler's items, their ids appended as they go, but for the first ``skipped``: those a loader draws
    to fast-forward to where it resumes (:func:`_fast_forward`), which it never hands out. (A generator: 340 ns a
    batch where :class:`_Recording`'s ``__next__`` takes 480.)"""
    yield from itertools.islice(inner, skipped)
    for item in inner:
        append(read(item))
        yield item


def _fast_forward(caller: Any) -> int:
    """How many batches a loader resumed mid-epoch skips by drawing them through the recorder, where ``caller``
    (the frame that asked for its iterator) is torchdata's ``StatefulDataLoader`` restoring its iterator over a
    sampler with no state of its own (torch's, Accelerate's): it draws the epoch again and skips the batches it
    had handed out (``itertools.islice``). Their ids came first, and each step had those of a batch before it."""
    if caller.f_code.co_name not in ("load_state_dict", "_restore_main_state"):
        return 0
    it = caller.f_locals.get("self")
    if not type(it).__module__.startswith("torchdata."):
        return 0
    skipped = getattr(it, "_sampler_iter_yielded", 0)
    return skipped if type(skipped) is int and skipped > 0 else 0


class _Recording:
    """The index sampler's iterator, remembering the ids of what it yields. Anything else asked of it reaches the
    sampler's own iterator: torchdata's ``StatefulDataLoader`` saves and restores its position through that
    iterator's ``state_dict`` and ``load_state_dict``. A generator here had neither, and the loader, resumed
    mid-epoch, drew the rest of the epoch from a new order: other samples than without the Watch."""

    def __init__(self, inner: Iterator[Any], ids: deque[list[int] | None], read: Callable[[Any], list[int] | None]):
        self.inner = inner
        self._next, self._append, self._read = inner.__next__, ids.append, read  # (bound once: every batch runs this)

    def __iter__(self) -> _Recording:
        return self

    def __next__(self) -> Any:
        item = self._next()
        self._append(self._read(item))
        return item

    # The class's own, as _StatefulIndexRecorder's are: Python 3.12's isinstance(x, Stateful) does not see them
    # through __getattr__, and the position was neither saved nor restored (another order after a resume).
    def state_dict(self) -> Any:
        return self.inner.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: Any) -> None:
        self.inner.load_state_dict(state)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_next", "_append", "_read"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class DrawRecorder(IndexRecorder):
    """The ids of a loader's batches where one torch iterator serves every epoch (:func:`epoch_length`), recorded
    as that iterator draws its indices (it stands in for the iterator's ``_sampler_iter``).

    That iterator was made before the Watch, with the loader's own sampler, and may have drawn batches ahead (its
    workers' prefetch): each draw is numbered, and a batch gets the ids of the draw with its own number, or none.
    A batch the script takes from the iterator outside the watched loop shifts nothing.
    """

    def __init__(self, it: Any, batches: bool):
        self.draws: Iterator[Any] = it._sampler_iter
        super().__init__(self.draws, batches=batches)
        # Weakly: the iterator holds this recorder, and tuiwatch run keys it to the iterator in a WeakKeyDictionary,
        # whose values must not keep their keys (and an iterator its loader's workers) alive.
        self.it = weakref.ref(it)
        # The draws so far: indices sent to the workers, or (one process, no prefetch) the batches handed out.
        self.drawn: int = getattr(it, "_send_idx", None) or it._num_yielded
        self.numbers: deque[int] = deque()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = next(self.draws)
        self.ids.append(_batch_ids(item) if self.batches else _key_ids(item))
        self.numbers.append(self.drawn)
        self.drawn += 1
        return item

    def pop(self) -> list[int] | None:
        """The ids of the batch the iterator handed out last."""
        it = self.it()
        if it is None:
            return None
        handed = it._num_yielded - 1
        numbers, ids = self.numbers, self.ids
        while numbers and numbers[0] < handed:  # drawn for batches taken elsewhere, or before the recording began
            numbers.popleft()
            ids.popleft()
        if numbers and numbers[0] == handed:
            numbers.popleft()
            return ids.popleft()
        return None


def epoch_length(sampler: Any) -> int | None:
    """The batches an epoch where one torch iterator serves every epoch of its loader, so that its workers are not
    started again each epoch: YOLOv5's and Ultralytics' ``InfiniteDataLoader`` and timm's
    ``MultiEpochsDataLoader`` (``--use-multi-epochs-loader``), copied into many repositories, make it over a
    ``_RepeatSampler`` that repeats the real one for ever, and their ``__iter__`` hands out ``len(loader)`` of its
    batches. ``sampler`` is a loader's index sampler or an iterator's (a recorder standing in for it is seen
    through); None for any other."""
    if isinstance(sampler, IndexRecorder):
        sampler = sampler.recorded
    if "RepeatSampler" not in type(sampler).__name__:
        return None
    try:
        return len(sampler.sampler) or None
    except Exception:  # not such a sampler
        return None


def record_draws(it: Any) -> DrawRecorder | None:
    """The :class:`DrawRecorder` of a torch iterator over a map-style dataset that yields in order (put in now, or
    the one put in before); None for any other."""
    draws = getattr(it, "_sampler_iter", None)
    if isinstance(draws, DrawRecorder):
        return draws
    from torch.utils.data.dataloader import _DatasetKind

    if draws is None or it._dataset_kind != _DatasetKind.Map or getattr(it, "_in_order", True) is False:
        return None
    recorder = DrawRecorder(it, batches=it._auto_collation)
    it._sampler_iter = recorder
    return recorder


def _held_iterator(loader: Any) -> Any:
    """The torch iterator a loader of :func:`epoch_length`'s holds (``self.iterator``), or None."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    sampler = loader._index_sampler
    for value in vars(loader).values():
        if isinstance(value, _BaseDataLoaderIter) and value._index_sampler is sampler:
            return value
    return None


def _repeating_ids(loader: Any) -> DrawRecorder | None:
    """The id recorder of the iterator a loader of :func:`epoch_length`'s holds, put in at the first epoch
    watched (``loader`` one that :func:`iter_with_ids` records)."""
    try:
        if epoch_length(loader._index_sampler) is None:
            return None
        held = _held_iterator(loader)
        return None if held is None else record_draws(held)
    except Exception:  # never the loop's failure: no ids
        return None


def ids_of_size(ids: list[int] | None, size: int | None) -> list[int] | None:
    """``ids`` where their count is the batch's ``size`` (``measure.batch_size``): a batch paired with ids of
    another size gets none rather than another batch's."""
    return ids if ids is not None and size is not None and len(ids) == size else None


def _batch_ids(item: Any) -> list[int] | None:
    """A batch sampler's item as sample ids: its fresh list of ints (the usual) as it is, after a look at its
    first id; a custom batch sampler's list of numpy ints (np.random.permutation sliced) read as ints."""
    return item if type(item) is list and (not item or type(item[0]) is int) else _as_id_list(item)


def _key_ids(item: Any) -> list[int] | None:
    """A sampler's item where the loader does not batch (``batch_size=None``) as sample ids: a tuple is one
    sample's key (``(shard, offset)``), not several ids."""
    return None if type(item) is tuple else _as_id_list(item)


def _as_id_list(item: Any) -> list[int] | None:
    """A sampler's item as sample ids: an integer (numpy's and torch's too), or a sequence of them; None for
    keys that are not integers (a dataset indexed by file name), which the ledger's ids cannot hold."""
    if type(item) is int:
        return [item]  # a plain sampler's index (a loader without batches)
    try:
        return [operator.index(i) for i in item]
    except TypeError:  # not a sequence (one index, the usual without a batch sampler), or not of integers
        try:
            return [operator.index(item)]
        except TypeError:
            return None


def _recordable(loader: Any) -> bool:
    """A map-style torch DataLoader that yields in sampling order."""
    try:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _DatasetKind
    except ImportError:  # pragma: no cover - torch is there in the publisher
        return False
    return (
        isinstance(loader, DataLoader)
        and loader._dataset_kind == _DatasetKind.Map
        and getattr(loader, "in_order", True) is not False
    )


def iter_owners() -> list[type]:
    """torch's DataLoader and its subclasses defined so far that make their iterator without ``DataLoader.__iter__``
    (an ``__iter__`` of their own): torchdata's ``StatefulDataLoader``, where the id recorder must go in too."""
    from torch.utils.data import DataLoader

    owners: list[type] = [DataLoader]
    pending = list(DataLoader.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "__iter__" in vars(cls) and cls not in owners:
            owners.append(cls)
    return owners


def resumable(loader_class: type) -> bool:
    """A DataLoader class that saves and restores its position (``state_dict``, ``load_state_dict``: torchdata's
    ``StatefulDataLoader``) and returns its iterator from an ``__iter__`` of its own: not a generator over one it
    holds (timm's ``MultiEpochsDataLoader``, YOLO's ``InfiniteDataLoader``), whose ids come otherwise."""
    own = vars(loader_class).get("__iter__")
    return (
        own is not None
        and not inspect.isgeneratorfunction(own)
        and callable(getattr(loader_class, "state_dict", None))
        and callable(getattr(loader_class, "load_state_dict", None))
    )


def adapted(loader: Any) -> Any:
    """The loader an adapter hands on batch for batch, in order, or None: Accelerate's prepared loader
    (``DataLoaderShard``, ``base_dataloader``), Lightning Fabric's (``_FabricDataLoader``, which only moves each
    batch to the device), timm's ``PrefetchLoader`` (which also normalises each batch), a tqdm progress bar over
    it (``watch.batches(tqdm(loader))``). Known classes only: ids paired with the wrong batches are worse than
    none."""
    base = getattr(loader, "base_dataloader", None)
    if base is not None:
        return base
    kind = type(loader)
    if kind.__name__ == "_FabricDataLoader":
        return getattr(loader, "_dataloader", None)
    if kind.__name__ == "PrefetchLoader":  # timm's, and the copies of it other repositories carry
        return getattr(loader, "loader", None)
    if _is_tqdm(loader):
        return getattr(loader, "iterable", None)
    return None


def draws_one_ahead(adapter: Any, loader: Any) -> bool:
    """Whether ``adapter`` hands the loop ``loader``'s batches one behind its drawing: Accelerate's prepared loader
    draws the next batch to know whether this one is the last, and timm's ``PrefetchLoader`` and apex's
    ``data_prefetcher`` move the next one to the device while the loop trains on this one. Each batch is the
    loop's when the next is drawn, and the last when the drawing ends."""
    if getattr(adapter, "base_dataloader", None) is loader:
        return True
    name = type(adapter).__name__
    if name == "PrefetchLoader":
        return getattr(adapter, "loader", None) is loader
    # NVIDIA apex's ImageNet example's, copied into many repositories: iter(loader) in its __init__ (before it holds
    # the iterator), each next() in its preload(), one batch before the loop's prefetcher.next() hands it over.
    return name.lower() == "data_prefetcher"


def _is_tqdm(loader: Any) -> bool:
    return any(c.__module__ == "tqdm.std" and c.__name__ == "tqdm" for c in type(loader).__mro__)  # tqdm.auto's too


def iter_with_ids(
    loader: Any, iterate: Callable[[Any], Iterator[Any]] = iter
) -> tuple[Iterator[Any], IndexRecorder | None]:
    """``iterate(loader)`` and, for a map-style DataLoader that yields in order, its id recorder. ``iterate`` is
    ``iter``, or torch's own ``DataLoader.__iter__`` where that is what was called: a subclass's ``__iter__`` that
    calls ``super().__iter__()`` (timm's ``MultiEpochsDataLoader``, a ``DataLoaderX``) must get torch's iterator,
    not its own generator (whose first ``next()`` then ran inside itself: "generator already executing")."""
    handed = adapter_with_ids(loader, iter)
    if handed is not None:
        return handed
    if not _recordable(loader):
        return iterate(loader), None
    # Persistent workers: the loader keeps its iterator, and the recorder in it, from epoch to epoch. (torchdata's
    # StatefulDataLoader keeps its last iterator without them too, and makes a new one: that one needs a recorder.)
    reused = loader.persistent_workers and loader.num_workers > 0
    existing = getattr(getattr(loader, "_iterator", None), "_index_sampler", None) if reused else None
    if isinstance(existing, IndexRecorder):
        return iterate(loader), existing
    attr = "batch_sampler" if loader._auto_collation else "sampler"
    original = getattr(loader, attr)
    recorder = index_recorder(original, batches=loader._auto_collation)
    # DataLoader.__setattr__ forbids this after init; the swap lasts only for iter().
    object.__setattr__(loader, attr, recorder)
    try:
        it = iterate(loader)
    finally:
        object.__setattr__(loader, attr, original)
    if getattr(it, "_index_sampler", None) is not recorder:
        return it, _repeating_ids(loader)  # (a subclass's generator over the iterator it holds, or no ids)
    return it, recorder


def adapter_with_ids(
    adapter: Any, iterate: Callable[[Any], Iterator[Any]]
) -> tuple[Iterator[Any], IndexRecorder] | None:
    """An adapter's batches as ``iterate(adapter)`` hands them (``iter``, or the adapter's own ``__iter__`` where
    that is wrapped) and its DataLoader's id recorder; None for anything else, and for an adapter that skips its
    first batches (resuming mid-epoch: their ids would come first).

    An adapter builds its DataLoader's iterator at its first batch, not in ``iter()`` (both are generators), and
    Accelerate's fetches one batch ahead: the recorder stays in the DataLoader for the whole epoch, and the ids
    still come out oldest first."""
    base = adapted(adapter)
    if base is None or not _recordable(base) or int(getattr(adapter, "skip_batches", 0) or 0):
        return None
    attr = "batch_sampler" if base._auto_collation else "sampler"
    current = getattr(base, attr)
    original = current.recorded if isinstance(current, IndexRecorder) else current  # an epoch left unfinished
    recorder = index_recorder(original, batches=base._auto_collation)

    def batches() -> Iterator[Any]:
        object.__setattr__(base, attr, recorder)
        try:
            yield from iterate(adapter)
        finally:
            object.__setattr__(base, attr, original)

    return batches(), recorder
