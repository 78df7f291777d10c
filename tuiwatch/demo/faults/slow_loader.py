"""A data loader that sleeps: each batch takes 50 ms to assemble, the model about 1 ms to train on it.

Expected: ``data-bound`` at step 49, once the 50-step window is full. (50 ms
rather than 20: beside other jobs on two cores, a 1 ms step can take 20 ms
of wall time, and the loader must still dominate.)
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import default_collate

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "data-bound"
STARTS = 0


def slow_collate(samples: list[Any]) -> Any:
    time.sleep(0.05)  # the bug: a slow transform (decoding, a network read) in the main process
    return default_collate(samples)


def run(steps: int = 300, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = loader(x, y, g, collate_fn=slow_collate)
    return train(model, optimizer, batches, name="fault-slow-loader", steps=steps, run_dir=run_dir, seed=seed, **kw)


if __name__ == "__main__":
    run()
