"""``tuiwatch.hf.TuiwatchCallback``: a Hugging Face ``Trainer`` callback (imports transformers)."""

from tuiwatch.integrations.hf import TuiwatchCallback

__all__ = ["TuiwatchCallback"]
