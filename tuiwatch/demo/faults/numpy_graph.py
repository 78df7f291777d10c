"""A graph broken by a NumPy round-trip.

The logits go through ``.detach().numpy()`` (say, for a post-processing step
written in NumPy) and come back as a new leaf tensor: ``backward()`` works,
but no gradient reaches the model. Expected: ``grad-zero`` (gradients missing)
after 5 optimizer steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "grad-zero"
STARTS = 0


def through_numpy(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    logits = model(x).detach().numpy()  # the bug: the graph ends here
    return torch.tensor(logits, requires_grad=True)


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train(
        model,
        optimizer,
        loader(x, y, g),
        name="fault-numpy-graph",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        forward=through_numpy,
        **kw,
    )


if __name__ == "__main__":
    run()
