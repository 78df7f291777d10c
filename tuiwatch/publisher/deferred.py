"""Values that live on the device until the background thread can read them without a sync.

On CUDA, :func:`defer` starts a non-blocking copy into pinned host memory and
records an event; the pipeline thread asks :func:`is_ready` (``event.query()``,
no sync) and then :func:`resolve` turns the value into a Python number. No
call here ever waits for the device: a value read before its event completed
is None (the pipeline waits for readiness, bounded, before it reads).

Step times on CUDA work the same way: :func:`device_mark` records a timing
event on the current stream at the start of a step and another at its end;
the pipeline reads the GPU time between them once the end event has completed
(:class:`PendingDuration`), so ``compute_s`` is the device's time for the step,
not the host's time to launch it, and nobody waits for it.

On the CPU there is no device to wait for: the value exists when the op
returns, and ``.item()`` reads it in ~0.1 µs. Reading it at once is cheaper
than ``detach()``, frees the autograd graph, and keeps torch calls off the
pipeline thread: torch releases the GIL inside each call, and a background
thread doing so hands the GIL back and forth with the training thread on every
op (measured: +230 µs per step of the tiny MLP, against +24 µs of work).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

# Whether this process has made a pending value yet. Until it has (every CPU run), every value is a number and a
# step is ready as soon as it is put: the pipeline skips asking each of its values (~5 µs a record).
_made_any = False


def _made() -> None:
    global _made_any
    _made_any = True


def any_made() -> bool:
    """Whether a pending device value (a copy or a duration) was ever made in this process."""
    return _made_any


class PendingCopy:
    """A device scalar being copied to pinned host memory."""

    __slots__ = ("event", "host")

    def __init__(self, host: torch.Tensor, event: Any):
        _made()
        self.host = host
        self.event = event

    def ready(self) -> bool:
        return bool(self.event.query())

    def value(self) -> Any:
        """The number, or None if the copy has not arrived (never waits: no sync, ever)."""
        return self.host.item() if self.event.query() else None


class PendingDuration:
    """Seconds of device time between two timing events, readable once ``end`` has completed.

    ``host_s`` (the host's time for the same span) stands in when the events
    cannot be read (a stream captured into a CUDA graph, a device reset).
    """

    __slots__ = ("end", "host_s", "start")

    def __init__(self, start: Any, end: Any, host_s: float):
        _made()
        self.start = start
        self.end = end
        self.host_s = host_s

    def ready(self) -> bool:
        return bool(self.end.query())

    def value(self) -> float:
        """The device time, or the host time if the events cannot be read now (never waits)."""
        try:
            if self.end.query():
                return float(self.start.elapsed_time(self.end)) / 1000.0
        except RuntimeError:
            pass
        return self.host_s


_PENDING = (PendingCopy, PendingDuration)


def defer(t: torch.Tensor) -> Any:
    """A scalar tensor as a Python number (CPU) or a :class:`PendingCopy` (CUDA)."""
    if not t.is_cuda:  # (t.device would build a torch.device at every call)
        return t.item()  # CPU: no sync exists; other accelerators: documented as syncing
    t = t.detach()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return PendingCopy(host, event)


def device_mark() -> Any:
    """A CUDA timing event recorded now on the current stream (host side only, no sync)."""
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def defer_tensor(value: Any) -> Any:
    """A tensor deferred with :func:`defer`; a number (or None) as it is."""
    return defer(value) if isinstance(value, torch.Tensor) else value


def is_ready(value: Any) -> bool:
    return not isinstance(value, _PENDING) or value.ready()


def number(value: Any) -> Any:
    """A value as a record holds it: numbers (every value, on the CPU) as they are, device values read."""
    return value if value is None or type(value) is float else resolve(value)


def resolve(value: Any) -> Any:
    """A deferred value (or a list of them) as Python numbers; other values unchanged."""
    if isinstance(value, _PENDING):
        return value.value()
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, list):
        return [resolve(v) for v in value]
    kind: type = type(value)
    if kind is not float and kind is not int and kind is not bool and isinstance(value, numbers.Real):
        # numpy's (an lr a hand-written schedule computed with np.cos): the rules read numbers by their type.
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    return value
