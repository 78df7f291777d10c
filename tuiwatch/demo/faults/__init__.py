"""One short training script per fault a rule should name (SPEC §6), plus the healthy baseline.

Each module is a readable scenario (its docstring says the bug and the
expected alert; the bug is the line marked "the bug") with ``run(steps, seed,
run_dir, **kw) -> Outcome`` and a ``RULE``. They run with ``tuiwatch demo
--fault NAME``, directly (``python demos/faults/nan_input.py``), and in the
tests and ``bench/rule_matrix.py``.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

FAULTS = {
    "nan-input": "nan_input",
    "log-zero": "log_zero",
    "big-lr": "big_lr",
    "numpy-graph": "numpy_graph",
    "optimizer-copy": "optimizer_copy",
    "lr-collapse": "lr_collapse",
    "shuffled-labels": "shuffled_labels",
    "slow-loader": "slow_loader",
    "kept-graphs": "kept_graphs",
    "long-sequence": "long_sequence",
    "overfit": "overfit",
    "eval-train-mode": "eval_train_mode",
    "corrupt-batch": "corrupt_batch",
}


def scenario(name: str) -> ModuleType:
    """The module of fault ``name`` (one of :data:`FAULTS`)."""
    return import_module(f"tuiwatch.demo.faults.{FAULTS[name]}")
