"""log(0) in a hand-written cross-entropy.

``-log(softmax(logits)[y])`` underflows to ``log(0) = -inf`` as soon as one
sample's true class gets probability 0 in float32; here an outlier point far
on the wrong side of the boundary does it. Expected: ``nonfinite`` at the step
that draws it, boundary=loss (the batch and the logits are finite).
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch import NonFiniteError
from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "nonfinite"
SAMPLE = 777


def handwritten_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=1)
    return -torch.log(probs[torch.arange(len(y)), y]).mean()  # the bug: log of a probability that can be 0


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    x[SAMPLE] = torch.tensor([3000.0, -2000.0])  # an outlier: finite, far out, labelled against its side
    y[SAMPLE] = 0
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train(
        model,
        optimizer,
        loader(x, y, g),
        name="fault-log-zero",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        loss_fn=handwritten_cross_entropy,
        expected=(NonFiniteError,),
        **kw,
    )


if __name__ == "__main__":
    print(run().error)
