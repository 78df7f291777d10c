"""The publisher: runs inside the training process. torch is allowed here, Textual never."""

from tuiwatch.publisher.watch import Watch

__all__ = ["Watch"]
