"""Healthy runs for the false-alarm check: both demo models, plain or with the usual training machinery.

``tuned`` adds what real loops have and what a careless rule mistakes for a
fault: dropout, a linear warm-up from 0 then a cosine decay to 0, gradient
clipping at 1.0, gradient accumulation over 2 batches, and validation every
100 steps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from tuiwatch.demo.loop import Outcome, Validation, train
from tuiwatch.demo.problems import PROBLEMS

VARIANTS = ("plain", "tuned")


def warmup_cosine(total: int, warmup: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def run_healthy(
    model_name: str,
    *,
    seed: int,
    steps: int = 1000,
    variant: str = "plain",
    run_dir: str | Path | None = "runs",
    **kw: Any,
) -> Outcome:
    torch.manual_seed(seed)
    tuned = variant == "tuned"
    problem = PROBLEMS[model_name](seed, dropout=0.1 if tuned else 0.0)
    options: dict[str, Any] = {"val": Validation(problem.val, every=100)}
    if tuned:
        accumulate = 2
        scheduler = torch.optim.lr_scheduler.LambdaLR(problem.optimizer, warmup_cosine(steps // accumulate, 50))
        options.update(scheduler=scheduler, scheduler_per_batch=True, clip=1.0, accumulate=accumulate)
    return train(
        problem.model,
        problem.optimizer,
        problem.train,
        name=f"healthy-{model_name}-{variant}",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        **options,
        **kw,
    )
