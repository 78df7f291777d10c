"""A large CPU batch tensor's finiteness is read on the publisher thread, not on the training thread.

The probe is a sum over every element, bound by memory bandwidth: ~10 ms of a
core for a batch of 256 float images of 224×224 (154 MB), which the training
thread paid at every step before its forward, while a GPU waited for it. A
CPU tensor of :data:`HELD_BYTES` or more is instead held by its step and
summed when the step's record is built, on the publisher thread; torch
releases the GIL inside the sum, so the training thread goes on meanwhile.
Smaller tensors are probed at once: their sum costs the training thread less
than holding them does (on bench/overhead.py's CNN, whose 768 KiB batch is
over the line, the batch's facts took 95 µs of the step at once and 30 held).
Tensors on a GPU are probed at once too, by an asynchronous kernel.

The tensor must still hold what the loader gave when it is summed. A loader
that writes each batch into memory it used before (a pool of pinned buffers, a
prefetcher's) would have overwritten it by then, and a loop that changes its
batch in place (``x.nan_to_num_()``, a normalisation by ``sub_``/``div_``)
would have changed it. So the first :data:`WARMUP` large tensors are probed at
once while they are watched: a tensor whose first element is at the address
of one still alive among the last :data:`WINDOW` is taken for reused memory,
and one of those whose version counter moved (every in-place write bumps it)
for a batch the loop changes; either way every probe of the run is taken at
once from then on, as before. A held tensor found so changed before its sum
(a loader or a loop that began only after the warm-up) gives the step a batch
finiteness of null, not a guess.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tuiwatch.publisher.measure import BatchInfo

HELD_BYTES = 256 << 10  # a CPU tensor this large is probed on the publisher thread (bench/large_batches.py)
HELD_MAX_BYTES = 256 << 20  # about this much at most held for probes (a stalled publisher thread holds no more)
WARMUP = 16  # the first large tensors, probed at once while they are watched for reused memory and changes
WINDOW = 16  # how many recent large tensors are watched: their addresses and versions


class LateProbes:
    """Decides, on the training thread, which large CPU tensors a step holds for the publisher thread to probe."""

    def __init__(self) -> None:
        self.on = True  # False for the rest of the run once a loader reused a batch's memory or the loop changed one
        self.seen = 0
        # (address, tensor, its batch, its version when seen) of the last large tensors, weakly
        self._recent: deque[tuple[int, weakref.ref[torch.Tensor], weakref.ref[BatchInfo], int]] = deque(maxlen=WINDOW)
        # The batches that hold tensors, oldest first; the publisher thread probes them in that order.
        self._held: deque[weakref.ref[BatchInfo]] = deque()

    def hold(self, t: torch.Tensor, info: BatchInfo) -> bool:
        """Whether ``info`` may hold the large CPU tensor ``t`` for a later probe (else it is probed now)."""
        address = t.data_ptr()
        for seen_at, tensor, batch, version in self._recent:
            if (live := tensor()) is None or (other := batch()) is info:
                continue  # (within one batch, one tensor given twice: an autoencoder's (x, x))
            # Two live tensors of two batches at one address share memory: the loader writes batches where earlier
            # ones were. A version that moved: the loop wrote into its batch after it was given.
            if seen_at == address or live._version != version:
                self.on = False
                if other is not None and other.held is not None:
                    other.overwritten = True
        self._recent.append((address, weakref.ref(t), weakref.ref(info), t._version))
        self.seen += 1
        if not self.on or self.seen <= WARMUP:
            return False
        held = self._held
        while held and ((first := held[0]()) is None or first.held is None):  # probed, or its step was dropped
            held.popleft()
        if len(held) * t.nbytes >= HELD_MAX_BYTES:
            return False
        held.append(weakref.ref(info))
        return True
