"""A NaN in one input sample.

Expected: ``nonfinite`` at the step that draws sample 1234, boundary=batch,
the sample's id in the evidence; ``on_nonfinite="stop"`` raises before the
update, and the dump holds the batch and the last healthy weights.
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch import NonFiniteError
from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "nonfinite"
SAMPLE = 1234


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    x[SAMPLE, 1] = float("nan")  # the bug: one corrupt feature in the data
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train(
        model,
        optimizer,
        loader(x, y, g),
        name="fault-nan-input",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        expected=(NonFiniteError,),
        **kw,
    )


if __name__ == "__main__":
    print(run().error)
