"""Shuffled labels: the targets were permuted apart from their inputs.

Nothing is learnable, so the loss stays at ln(2), chance for 2 classes
(inferred from the width of the model's output). Expected: ``loss-chance`` at
step 199, the first step it may speak.
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "loss-chance"
STARTS = 0


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    y = y[torch.randperm(len(y), generator=g)]  # the bug: labels shuffled on their own
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train(
        model, optimizer, loader(x, y, g), name="fault-shuffled-labels", steps=steps, run_dir=run_dir, seed=seed, **kw
    )


if __name__ == "__main__":
    run()
