"""``tuiwatch.lightning.TuiwatchCallback``: a Lightning ``Trainer`` callback (imports Lightning)."""

from tuiwatch.integrations.lightning import TuiwatchCallback

__all__ = ["TuiwatchCallback"]
