"""A framework's evaluation metrics as an eval record's (the Trainer's ``eval_*``, Lightning's ``val_*``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from tuiwatch.ledger.records import RESERVED_METRIC_NAMES


def eval_metrics(metrics: Mapping[str, Any], prefixes: Iterable[str]) -> dict[str, float]:
    """The finite scalars of ``metrics``, named without the first of ``prefixes`` they start with (``val_loss``
    is ``loss``: the viewer's loss chart); the epoch (a float in both frameworks) and names tuiwatch records
    itself are left out. A one-element tensor is read once (an evaluation's, off the training steps)."""
    prefixes = tuple(prefixes)
    values = {}
    for key, value in metrics.items():
        name = next((key[len(p) :] for p in prefixes if key.startswith(p)), key)
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if number and name not in RESERVED_METRIC_NAMES and name != "epoch":
            values[name] = float(value)
    return values
