"""Exploding gradients from a learning rate 200 times too large, set at step 60.

Expected: ``grad-explosion`` within a few steps of step 60 (the loss spikes
too); left alone the run later goes non-finite and stops.
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch import NonFiniteError
from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "grad-explosion"
STARTS = 60


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # the bug: a "boost" meant as x2 typed as x200
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 if s < STARTS else 200.0)
    return train(
        model,
        optimizer,
        loader(x, y, g),
        name="fault-big-lr",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        scheduler=scheduler,
        scheduler_per_batch=True,
        clip=None,
        expected=(NonFiniteError,),
        **kw,
    )


if __name__ == "__main__":
    print(run().error)
