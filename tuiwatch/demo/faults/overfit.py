"""A tiny, noisy training set that a wide network memorises.

48 training points, a quarter with flipped labels, a 2-256-256-2 MLP and Adam:
the training loss goes to 0 while the loss on 1,024 held-out points rises.
Expected: ``overfit`` a few evals (every 25 steps) after the eval loss turns.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tuiwatch.demo.loop import Outcome, Validation, train
from tuiwatch.demo.problems import loader, seeded_problem, separable

RULE = "overfit"
STARTS = 0


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed, 48)  # the bug: far too little data for the model...
    flip = torch.rand(len(y), generator=g) < 0.25
    y[flip] = 1 - y[flip]  # ...and noisy labels in it
    model = nn.Sequential(nn.Linear(2, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(
        model,
        optimizer,
        loader(x, y, g, batch_size=16),
        name="fault-overfit",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        val=Validation(separable(1024, g), every=25),
        **kw,
    )


if __name__ == "__main__":
    run()
