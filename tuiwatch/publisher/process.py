"""What a Watch hooks into the process: interpreter exit, uncaught exceptions, fork, SIGTERM.

Every live Watch is in :data:`watches`; the hooks are installed once per
process, by the first Watch, and close those still open with the reason the
process is ending for. A process that multiprocessing started (a hogwild
worker, a rank of ``mp.spawn``) gets one more: under fork and forkserver it
ends with ``os._exit``, which runs no atexit hook, and the target's exception
never reaches ``sys.excepthook``; multiprocessing's own exit finalizers run
first, with that exception still in ``sys.exc_info()`` up to Python 3.12.
From 3.13 they run after it was handled, and the target's exception is seen
where multiprocessing prints it (:func:`_note_the_targets_exception`).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from tuiwatch.errors import NonFiniteError, StopRequested

watches: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False
_uncaught: list[type[BaseException]] = []
_terminated: list[int] = []  # SIGTERM received: the run ends "killed"
_finalized_in: int | None = None  # the pid whose multiprocessing exit finalizer closes its Watches


def is_oom(failure: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's RuntimeError."""
    if isinstance(failure, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(failure, RuntimeError) and "can't allocate memory" in str(failure)


def end_reason(exc_type: type[BaseException] | None) -> str:
    """The ``end`` record's reason for a process ending with ``exc_type`` (None: normally)."""
    if _terminated:
        return "killed"
    if exc_type is None:
        return "finished"
    if issubclass(exc_type, NonFiniteError):
        return "nonfinite"
    if issubclass(exc_type, KeyboardInterrupt):
        return "stopped"
    return "stopped" if issubclass(exc_type, StopRequested) else "exception"


def install_hooks() -> None:
    global _installed
    _close_at_multiprocessing_exit()  # per process: a forked child inherits _installed, not the finalizer
    if _installed:
        return
    _installed = True
    atexit.register(_close_all_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    previous: Callable[..., Any] = sys.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        _uncaught.append(exc_type)
        if is_oom(exc):
            for watch in list(watches):
                watch._record_oom(exc)
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    _install_sigterm_handler()


def _close_all_at_exit() -> None:
    failure = _uncaught[-1] if _uncaught else sys.exc_info()[0]  # (the latter: a multiprocessing target's)
    reason = end_reason(None if failure is not None and issubclass(failure, SystemExit) else failure)
    for watch in list(watches):
        watch.close(reason)


def _close_at_multiprocessing_exit() -> None:
    global _finalized_in
    pid = os.getpid()
    if _finalized_in == pid or multiprocessing.parent_process() is None:
        return
    _finalized_in = pid
    multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=0)
    _note_the_targets_exception()


def _note_the_targets_exception() -> None:
    """``traceback.print_exc`` notes the exception it prints when multiprocessing's ``_bootstrap`` calls it for the
    target's: from Python 3.13 that is the one moment the exception is known (the exit finalizers run after
    ``_bootstrap`` returned, and a worker whose target raised ended its ledger "finished"). A loop's own
    ``print_exc()`` of an exception it handled is another caller's, and is not noted."""
    printed = traceback.print_exc
    if getattr(printed, "_tuiwatch", False):
        return  # (inherited from a parent process that is itself a multiprocessing child)
    bootstrap = multiprocessing.process.BaseProcess._bootstrap.__code__  # type: ignore[attr-defined]

    def print_exc(*args: Any, **kwargs: Any) -> None:
        if sys._getframe(1).f_code is bootstrap:
            failure = sys.exc_info()[0]
            if failure is not None:
                _uncaught.append(failure)
        printed(*args, **kwargs)

    print_exc._tuiwatch = True  # type: ignore[attr-defined]
    traceback.print_exc = print_exc


def _after_fork_in_child() -> None:
    for watch in list(watches):
        watch._forked_child()
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a loader worker keeps the default SIGTERM


def _install_sigterm_handler() -> None:
    """SIGTERM (a scheduler's kill, ``kill PID``) ends the ledger with reason ``killed``, then the process exits.

    Only where SIGTERM still has its default action and only from the main
    thread: a handler the program installed itself is left alone. The handler
    raises SystemExit(143), so the stack unwinds normally (locks are released,
    ``with`` blocks close their Watch) and the exit status is the one a
    SIGTERM gives.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    _terminated.append(signum)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
    raise SystemExit(128 + signum)
