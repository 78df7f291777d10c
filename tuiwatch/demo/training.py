"""``tuiwatch demo``: one of the demo's problems trained with a Watch, printing a status line now and then."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

import torch

import tuiwatch
from tuiwatch.demo.loop import Validation, train
from tuiwatch.demo.problems import PROBLEMS


def run_demo(
    model_name: str = "mlp",
    *,
    steps: int = 3000,
    delay_s: float = 0.01,
    seed: int = 0,
    run_dir: str | Path | None = "runs",
    status_every_s: float = 2.0,
    out: TextIO = sys.stdout,
) -> tuiwatch.Watch:
    """Train ``model_name`` for ``steps`` steps, validating at the end of each epoch."""
    torch.manual_seed(seed)
    problem = PROBLEMS[model_name](seed)
    print(f"tuiwatch demo: training the {model_name} for {steps} steps", file=out, flush=True)
    started = last_status = time.monotonic()

    def status(step: int, loss: torch.Tensor) -> None:
        nonlocal last_status
        now = time.monotonic()
        if now - last_status >= status_every_s:
            last_status = now
            print(
                f"step {step:>6}  loss {loss.item():.4f}  {step / (now - started):,.0f} steps/s", file=out, flush=True
            )

    outcome = train(
        problem.model,
        problem.optimizer,
        problem.train,
        name=f"demo-{model_name}",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        val=Validation(problem.val),
        on_step=status,
        delay_s=delay_s,
    )
    watch = outcome.watch
    reason = "stopped" if watch.should_stop else "finished"
    print(
        f"tuiwatch demo: {reason} after {outcome.steps} steps; ledger {watch.ledger_path or '(memory only)'}; "
        f"socket {watch.socket_path or '(none)'}",
        file=out,
    )
    return watch
