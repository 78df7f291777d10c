"""An optimizer built on a copy of the model.

The model is deep-copied (say, for an EMA or before moving it) and the
optimizer is given the copy's parameters: gradients reach the model, the
optimizer steps the copy. Expected: ``no-update`` after 20 optimizer steps
(the model's parameter norm never moves).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "no-update"
STARTS = 0


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    model = mlp()
    ema = copy.deepcopy(model)
    optimizer = torch.optim.SGD(ema.parameters(), lr=0.1, momentum=0.9)  # the bug: the copy's parameters
    return train(
        model, optimizer, loader(x, y, g), name="fault-optimizer-copy", steps=steps, run_dir=run_dir, seed=seed, **kw
    )


if __name__ == "__main__":
    run()
