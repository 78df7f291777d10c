"""The one error family of tuiwatch. Pure: importable without torch or Textual."""

from __future__ import annotations


class TuiwatchError(Exception):
    """Base of every error tuiwatch raises on purpose; its message is one line."""


class UnsafeSocketDirError(TuiwatchError):
    """The socket directory is not private to this user."""


class NonFiniteError(TuiwatchError):
    """Raised by ``on_nonfinite="stop"`` before a non-finite update reaches the weights."""

    def __init__(self, message: str, *, step: int, boundary: str, dump: str | None = None):
        super().__init__(message)
        self.step = step
        self.boundary = boundary
        self.dump = dump


class StopRequested(TuiwatchError):
    """Raised at a step boundary when a viewer asked the run to stop (``stop="raise"``)."""
