"""Validation run in train mode, with dropout on.

The loop forgets ``model.eval()`` before validating. Expected: ``eval-mode``
at the first validation (step 100).
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch.demo.loop import Outcome, Validation, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem, separable

RULE = "eval-mode"
STARTS = 100


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    model = mlp(dropout=0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    val = Validation(separable(512, g), every=STARTS, in_train_mode=True)  # the bug: no model.eval()
    return train(
        model,
        optimizer,
        loader(x, y, g),
        name="fault-eval-train-mode",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        val=val,
        **kw,
    )


if __name__ == "__main__":
    run()
