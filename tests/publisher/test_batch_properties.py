"""What a step record says of a batch, over batches of any nesting: never an exception, and never "finite" unseen.

Hypothesis builds batches of lists, tuples, dicts and dataclasses holding
tensors (with or without a NaN), text, numbers, paths and dates, numpy
arrays, and objects the walk does not look into, some of which raise when
asked anything. The batch's finiteness must be false when a float tensor or
a numpy array of floats in it holds a NaN, not known when a part that may
hold one was not read, and true only otherwise.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuiwatch.publisher.measure import BatchInfo, batch_size


@dataclass
class Truth:
    nan: bool = False  # a float tensor holds a NaN
    unread: bool = False  # a part not read may hold one
    floats: bool = False  # a float tensor was found


class Opaque:
    """An object of one's own: the walk does not look into it."""


class Proxy:
    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"proxy not connected: {name}")


@dataclass
class Pair:
    a: Any
    b: Any


def tensors() -> st.SearchStrategy[tuple[Any, Truth]]:
    def build(dtype: torch.dtype, shape: list[int], nan: bool) -> tuple[Any, Truth]:
        t = torch.ones(shape, dtype=dtype)
        floating = dtype.is_floating_point
        if nan and floating and t.numel():
            t.view(-1)[t.numel() // 2] = math.nan
            return t, Truth(nan=True, floats=True)
        return t, Truth(floats=floating)

    dtypes = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool])
    return st.builds(build, dtypes, st.lists(st.integers(0, 4), max_size=3), st.booleans())


def leaves() -> st.SearchStrategy[tuple[Any, Truth]]:
    known = st.one_of(
        st.none(),
        st.integers(),
        st.floats(),
        st.text(max_size=5),
        st.booleans(),
        st.sampled_from([Path("a.png"), datetime.date(2026, 12, 7), torch.float16]),
    ).map(lambda v: (v, Truth()))
    arrays = st.sampled_from(
        [
            (numpy.arange(3), Truth()),
            (numpy.array(["a.png", "b.png"]), Truth()),
            (numpy.zeros(3), Truth(floats=True)),  # (summed by numpy)
            (numpy.array([1.0, math.nan]), Truth(nan=True, floats=True)),
            (numpy.array([1 + 2j]), Truth(unread=True)),  # (a complex array is not summed)
            (numpy.float32(1.5), Truth()),
        ]
    )
    objects = st.sampled_from([Opaque, Proxy]).map(lambda kind: (kind(), Truth(unread=True)))
    return st.one_of(tensors(), known, arrays, objects)


def merge(parts: list[Truth]) -> Truth:
    return Truth(any(p.nan for p in parts), any(p.unread for p in parts), any(p.floats for p in parts))


def containers(inner: st.SearchStrategy[tuple[Any, Truth]]) -> st.SearchStrategy[tuple[Any, Truth]]:
    def sequence(items: list[tuple[Any, Truth]], kind: type) -> tuple[Any, Truth]:
        return kind(v for v, _ in items), merge([t for _, t in items])

    def mapping(items: dict[str, tuple[Any, Truth]]) -> tuple[Any, Truth]:
        return {k: v for k, (v, _) in items.items()}, merge([t for _, t in items.values()])

    def pair(a: tuple[Any, Truth], b: tuple[Any, Truth]) -> tuple[Any, Truth]:
        return Pair(a[0], b[0]), merge([a[1], b[1]])

    return st.one_of(
        st.builds(sequence, st.lists(inner, max_size=4), st.sampled_from([list, tuple])),
        st.builds(mapping, st.dictionaries(st.text(max_size=4), inner, max_size=4)),
        st.builds(pair, inner, inner),
    )


batches = st.recursive(leaves(), containers, max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_a_batch_of_any_nesting_is_read_without_an_exception_and_called_finite_only_when_it_all_was(
    built: tuple[Any, Truth],
) -> None:
    batch, truth = built
    info = BatchInfo(batch)
    value = info.probe()
    if truth.nan:
        assert value is not None
        assert not math.isfinite(value)  # a NaN found is one, whatever else was not read
    elif truth.unread:
        assert value is None  # the tensors' sum is not the batch's
    elif truth.floats:
        assert value is not None
        assert math.isfinite(value)
    else:
        assert value is None  # nothing that can be non-finite was summed: the record says so from `seen`
    batch_size(batch)  # (never raises: its own guard)
