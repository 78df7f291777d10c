"""A default Watch against the trackers users already have, side by side in one process.

Arms on the tiny MLP (2-32-2, batch 64, one torch intra-op thread), run in
every round with the order rotating, each on a fresh copy of the model over
the same batches:

- bare: the training loop alone;
- tuiwatch: the loop under a default ``Watch`` with ``watch.log(loss=loss)``;
- trackio-10: the loop computes ten scalars as a user would (the grad norm
  with ``torch.nn.utils.get_total_norm`` before the step, as in the seed
  snippet; data wait and compute timed) and calls ``trackio.log`` every step;
- trackio-same: trackio logging what a Watch records: those ten, the batch's
  and the output's finiteness, and the parameter and update norms on every
  10th step (the Watch's sampling);
- wandb: ``wandb.init(mode="offline")`` and ``wandb.log`` of the ten scalars;
- tensorboard: ``SummaryWriter.add_scalar`` of the ten scalars.

For each arm: the median over rounds of the added wall time per step (arm -
bare, same round) and of the added training-thread CPU (``time.thread_time``),
and the ratio to tuiwatch's added wall time. The load average is printed at
start and end: on a shared machine, read the ratios, not the absolute times.
The peers are not dependencies of tuiwatch; an arm whose package is missing
is said and skipped:

    pip install trackio wandb tensorboard
    python bench/vs_peers.py [--rounds 7] [--steps 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import tuiwatch

Batches = list[tuple[torch.Tensor, torch.Tensor]]
# An arm: set up, then the loop timed alone: (wall seconds, training-thread CPU seconds), set-up and tear-down left out.
Arm = Callable[[nn.Module, torch.optim.Optimizer, Batches, Path], tuple[float, float]]


def data(steps: int) -> Batches:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 64, 2, generator=g)
    y = (x[:, 0] > 0).long()
    return [(x[i : i + 64], y[i : i + 64]) for i in range(0, len(x), 64)]


class Clock:
    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.thread_time() - self.cpu


def bare(model: nn.Module, opt: torch.optim.Optimizer, batches: Batches, _: Path) -> tuple[float, float]:
    with Clock() as c:
        for xb, yb in batches:
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return c.wall, c.cpu


def with_tuiwatch(model: nn.Module, opt: torch.optim.Optimizer, batches: Batches, run_dir: Path) -> tuple[float, float]:
    watch = tuiwatch.Watch(model, opt, run_dir=run_dir, name="bench", quiet=True)
    with Clock() as c:
        for xb, yb in watch.batches(batches):
            loss = nn.functional.cross_entropy(model(xb), yb)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    watch.close()
    return c.wall, c.cpu


def user_loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Batches,
    log: Callable[[dict[str, float], int], None],
    same_fields: bool = False,
) -> tuple[float, float]:
    """The loop a user writes to log ten scalars a step: the seed's grad-norm call, timings, the rate.

    ``same_fields``: what a Watch records, computed by hand: also both finiteness probes and the
    parameter and update norms on every 10th step.
    """
    params = list(model.parameters())
    with Clock() as c:
        t0 = time.perf_counter()
        for step, (xb, yb) in enumerate(batches):
            t1 = time.perf_counter()
            out = model(xb)
            loss = nn.functional.cross_entropy(out, yb)
            loss.backward()
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            before = [p.detach().clone() for p in params] if same_fields and step % 10 == 0 else None
            opt.step()
            opt.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            fields = {
                "loss": loss.item(),
                "lr": opt.param_groups[0]["lr"],
                "grad_norm": grad_norm.item(),
                "data_wait_s": t1 - t0,
                "compute_s": t2 - t1,
                "examples_per_s": len(xb) / (t2 - t0),
                "epoch": 0,
                "training": float(model.training),
            }
            if same_fields:
                fields["opt_step"] = step + 1
                fields["batch_finite"] = float(torch.isfinite(xb.sum()).item())
                fields["forward_finite"] = float(torch.isfinite(out.detach().sum()).item())
            else:
                fields["batch_size"] = len(xb)
                fields["finite"] = float(torch.isfinite(loss).item())
            if before is not None:
                with torch.no_grad():
                    fields["param_norm"] = torch.nn.utils.get_total_norm(params).item()
                    fields["update_norm"] = torch.nn.utils.get_total_norm(
                        [p - b for p, b in zip(params, before, strict=True)]
                    ).item()
            log(fields, step)
            t0 = t2
    return c.wall, c.cpu


def same_fields_loop(
    model: nn.Module, opt: torch.optim.Optimizer, batches: Batches, log: Callable[[dict[str, float], int], None]
) -> tuple[float, float]:
    return user_loop(model, opt, batches, log, same_fields=True)


def with_trackio(loop: Callable[..., tuple[float, float]]) -> Arm:
    def arm(model: nn.Module, opt: torch.optim.Optimizer, batches: Batches, _: Path) -> tuple[float, float]:
        import trackio

        with contextlib.redirect_stdout(io.StringIO()):
            trackio.init(project="tuiwatch-bench", embed=False, auto_log_gpu=False, auto_log_cpu=False)
        result = loop(model, opt, batches, lambda fields, step: trackio.log(fields, step=step))
        with contextlib.redirect_stdout(io.StringIO()):
            trackio.finish()
        return result

    return arm


def with_wandb(model: nn.Module, opt: torch.optim.Optimizer, batches: Batches, run_dir: Path) -> tuple[float, float]:
    import wandb

    run = wandb.init(
        mode="offline", dir=str(run_dir.parent), project="tuiwatch-bench", settings=wandb.Settings(silent=True)
    )
    result = user_loop(model, opt, batches, lambda fields, step: run.log(fields, step=step))
    run.finish()
    return result


def with_tensorboard(
    model: nn.Module, opt: torch.optim.Optimizer, batches: Batches, run_dir: Path
) -> tuple[float, float]:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))

    def log(fields: dict[str, float], step: int) -> None:
        for name, value in fields.items():
            writer.add_scalar(name, value, step)

    result = user_loop(model, opt, batches, log)
    writer.close()
    return result


ARMS: dict[str, tuple[str | None, Arm]] = {
    "bare": (None, bare),
    "tuiwatch": (None, with_tuiwatch),
    "trackio-10": ("trackio", with_trackio(user_loop)),
    "trackio-same": ("trackio", with_trackio(same_fields_loop)),
    "wandb": ("wandb", with_wandb),
    "tensorboard": ("tensorboard", with_tensorboard),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.environ.setdefault("WANDB_SILENT", "true")
    base = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    batches = data(args.steps)
    missing = sorted({pkg for pkg, _ in ARMS.values() if pkg and importlib.util.find_spec(pkg) is None})
    names = [name for name, (pkg, _) in ARMS.items() if pkg not in missing]
    load_start = os.getloadavg()
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="tuiwatch-vs-peers-") as tmp:
        os.environ.setdefault("TRACKIO_DIR", str(Path(tmp) / "trackio"))
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                model = copy.deepcopy(base)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                w, c = ARMS[name][1](model, opt, batches, Path(tmp) / f"{name}-{r}")
                wall[name].append(w / len(batches))
                cpu[name].append(c / len(batches))
    load_end = os.getloadavg()

    def added(series: dict[str, list[float]], name: str) -> float:
        return statistics.median(a - b for a, b in zip(series[name], series["bare"], strict=True))

    print(f"torch {torch.__version__}, 1 intra-op thread, {args.rounds} rotating rounds of {len(batches)} steps")
    print(f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end (1-minute)")
    print(f"bare step {statistics.median(wall['bare']) * 1e6:.1f} µs wall\n")
    ours = added(wall, "tuiwatch")
    print(f"{'arm':<14} {'added wall µs':>14} {'added train-thread CPU µs':>26} {'wall / tuiwatch':>16}")
    for name in names[1:]:
        a = added(wall, name)
        ratio = a / ours if ours > 0 else float("inf")
        print(f"{name:<14} {a * 1e6:>14.1f} {added(cpu, name) * 1e6:>26.1f} {ratio:>15.2f}x")
    if missing:
        print(f"\nnot run (not installed): {', '.join(missing)}: pip install {' '.join(missing)}")
    targets = [("trackio-same", 2.5), ("trackio-10", 2.0), ("wandb", 6.0), ("tensorboard", 6.0)]
    print("\nTargets (issue 18: tuiwatch adds less than the peer by at least this factor):")
    for name, factor in targets:
        if name in names:
            ratio = added(wall, name) / ours if ours > 0 else float("inf")
            print(f"  {'met    ' if ratio >= factor else 'NOT MET'}  {name} >= {factor}x  (measured {ratio:.2f}x)")


if __name__ == "__main__":
    main()
