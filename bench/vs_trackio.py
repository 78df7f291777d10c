"""A default Watch against trackio logging the same fields (SPEC §9), side by side in one process.

Three arms on the tiny MLP (2-32-2, batch 64, one torch intra-op thread),
interleaved in every round with the order rotating, each a fresh copy of the
model over the same batches:

- bare: the training loop alone;
- trackio: the loop computes what a Watch records, as a user would (the
  grad norm with ``torch.nn.utils.get_total_norm`` before the step, as in the
  seed snippet, and times data wait and compute), and calls ``trackio.log``
  with those ten scalars every step;
- tuiwatch: the loop under a default ``Watch`` with ``watch.log(loss=loss)``.

It prints the median over rounds of each arm's added wall time per step
(arm - bare, same round) and the ratio trackio / tuiwatch; the SPEC bar is a
ratio of at least 10. trackio is not a dependency of tuiwatch:

    pip install trackio
    python bench/vs_trackio.py [--rounds 9] [--steps 2000]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tuiwatch


def data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 64, 2, generator=g)
    y = (x[:, 0] > 0).long()
    return [(x[i : i + 64], y[i : i + 64]) for i in range(0, len(x), 64)]


def bare(model: nn.Module, opt: torch.optim.Optimizer, batches: list[Any], _: Path) -> float:
    start = time.perf_counter()
    for xb, yb in batches:
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def with_trackio(model: nn.Module, opt: torch.optim.Optimizer, batches: list[Any], _: Path) -> float:
    import trackio

    trackio.init(project="tuiwatch-bench", embed=False, auto_log_gpu=False, auto_log_cpu=False)
    params = list(model.parameters())
    t0 = start = time.perf_counter()
    for step, (xb, yb) in enumerate(batches):
        t1 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        trackio.log(
            {
                "loss": loss.item(),
                "lr": opt.param_groups[0]["lr"],
                "grad_norm": grad_norm.item(),
                "data_wait_s": t1 - t0,
                "compute_s": t2 - t1,
                "examples_per_s": len(xb) / (t2 - t0),
                "epoch": 0,
                "batch_size": len(xb),
                "finite": float(torch.isfinite(loss).item()),
                "training": float(model.training),
            },
            step=step,
        )
        t0 = t2
    elapsed = time.perf_counter() - start
    trackio.finish()
    return elapsed


def with_tuiwatch(model: nn.Module, opt: torch.optim.Optimizer, batches: list[Any], run_dir: Path) -> float:
    watch = tuiwatch.Watch(model, opt, run_dir=run_dir, name="bench")
    start = time.perf_counter()
    for xb, yb in watch.batches(batches):
        loss = nn.functional.cross_entropy(model(xb), yb)
        watch.log(loss=loss)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    watch.close()
    return elapsed


# Each arm returns the seconds its loop took, set-up and tear-down (init, finish, close) left out.
ARMS: dict[str, Callable[[nn.Module, torch.optim.Optimizer, list[Any], Path], float]] = {
    "bare": bare,
    "trackio": with_trackio,
    "tuiwatch": with_tuiwatch,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    batches = data(args.steps)
    names = list(ARMS)
    per_step: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="tuiwatch-vs-trackio-") as tmp:
        os.environ.setdefault("TRACKIO_DIR", str(Path(tmp) / "trackio"))
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                model = copy.deepcopy(base)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                per_step[name].append(ARMS[name](model, opt, batches, Path(tmp) / f"{name}-{r}") / len(batches))
    added = {
        name: statistics.median(a - b for a, b in zip(per_step[name], per_step["bare"], strict=True))
        for name in ("trackio", "tuiwatch")
    }
    print(f"torch {torch.__version__}, 1 intra-op thread, {args.rounds} rounds of {len(batches)} steps")
    print(f"bare step            {statistics.median(per_step['bare']) * 1e6:8.1f} µs")
    for name, value in added.items():
        print(f"added by {name:<11} {value * 1e6:8.1f} µs per step")
    ratio = added["trackio"] / added["tuiwatch"] if added["tuiwatch"] > 0 else float("inf")
    print(f"trackio / tuiwatch   {ratio:8.2f}x   (SPEC §9 bar: >= 10x) {'met' if ratio >= 10 else 'NOT MET'}")


if __name__ == "__main__":
    main()
