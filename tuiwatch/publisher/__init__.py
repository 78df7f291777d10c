"""The publisher: runs inside the training process. torch is allowed here, Textual never.

Empty on purpose: ``tuiwatch.publisher.background.nvml`` (used by ``tuiwatch doctor``)
must load without torch; the ``Watch`` is ``tuiwatch.Watch``.
"""
