"""A Watch that the loop let go of without ``close()`` ends its run when it is collected.

A sweep that makes a Watch per trial (Optuna's objective, a loop over
learning rates) and never closes them, or whose trial ends by an exception
(``optuna.TrialPruned``) outside any ``with``, left every trial's run open for
good: its publisher thread, socket and ledger, and through the thread's
callbacks the Watch, its model, optimizer state and the batches kept for dumps
(on a GPU, the trial's memory: the next trial's OOM).

So the publisher thread holds the Watch's parts only weakly (:func:`weakly`),
and a finalizer that holds nothing of the Watch (:func:`ended_unclosed`)
writes the ``end`` record, stops the thread, closes the run directory and takes
the hooks off a model the loop kept. A Watch is collected only when the loop
holds neither it nor its optimizer (the optimizer's hooks reach the Watch), so
a ``Watch(model, opt)`` left unassigned keeps watching while the optimizer
lives.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.clipping import unwatch_clipping

if TYPE_CHECKING:  # (hooks.py holds its tensor hook weakly with weakly(), below)
    from tuiwatch.publisher.hooks import Attached


def weakly(method: Callable[..., Any], otherwise: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` called through a weak reference to its object; ``otherwise`` once the object is gone."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        target = ref()
        return otherwise(*args) if target is None else target(*args)

    return call


def ended_unclosed(pipeline: Pipeline, attached: Attached, run_files: Directory | None) -> None:
    """The finalizer of a Watch collected unclosed. It may run on any thread (the publisher thread's own
    allocations can start a collection), so it waits for nothing: the thread writes the end and closes."""
    attached.remove()
    unwatch_clipping(None)
    pipeline.close_soon(None, then=run_files.close if run_files is not None else None)
