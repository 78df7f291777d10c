"""One corrupted batch: samples 3200-3263 were stored in other units (x1000).

The loader reads in order, so they form batch 50 of every epoch. Expected:
``loss-spike`` at step 50 with those ids in the evidence and the batch's
tensors in ``dumps/50-loss-spike/``; clipping keeps the run going.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import mlp, seeded_problem

RULE = "loss-spike"
STARTS = 50
CORRUPT = range(3200, 3264)


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    _, x, y = seeded_problem(seed)
    x[CORRUPT.start : CORRUPT.stop] *= 1000.0  # the bug: one shard in other units
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = DataLoader(TensorDataset(x, y), batch_size=64)
    return train(model, optimizer, batches, name="fault-corrupt-batch", steps=steps, run_dir=run_dir, seed=seed, **kw)


if __name__ == "__main__":
    run()
