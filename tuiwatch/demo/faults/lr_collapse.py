"""A learning rate collapsed by its scheduler.

``StepLR(step_size=30, gamma=0.1)`` is meant per epoch but stepped per batch:
the lr loses a decade every 30 steps. Expected: ``lr-zero`` once every lr has
been at most 1e-8 of its peak for 10 optimizer steps (about step 280).
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "lr-zero"
STARTS = 0


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    return train(
        model,
        optimizer,
        loader(x, y, g),
        name="fault-lr-collapse",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        scheduler=scheduler,
        scheduler_per_batch=True,  # the bug: a per-epoch schedule stepped per batch
        **kw,
    )


if __name__ == "__main__":
    run()
