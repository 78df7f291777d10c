"""One classifier trained in six loop styles people write, under four lr schedules, with a fault planted or not.

The generalisation matrix of docs/rules.md (issue 15): the rules must be quiet
on every healthy run here and name every planted fault, first, soon after
its onset. The styles differ where rules can be fooled: the batch's and the
output's shape (tuples, dicts), what a step is (accumulation), the numbers
(bf16 autocast with a GradScaler), the loader (an IterableDataset over two
workers) and the loop's own shape (``watch.step()`` with a ``get_batch``).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tuiwatch
from tuiwatch.ledger.reader import read_ledger

STYLES = ("plain", "dict", "accumulate", "autocast", "iterable", "get_batch")
SCHEDULES = ("constant", "warmup_cosine", "step_decay", "plateau")
# fault → the rule that must name it
FAULTS = {
    "nan-input": "nonfinite",
    "wrong-units": "loss-spike",
    "lr-zero": "lr-zero",
    "detached": "grad-zero",
    "shuffled-labels": "loss-chance",
    "slow-loader": "data-bound",
    "eval-train-mode": "eval-mode",
}
CLASSES, FEATURES, N = 4, 12, 16384  # two epochs in 1,000 steps: enough data not to overfit
BATCH = 32


class Classifier(nn.Module):
    def __init__(self, dict_output: bool, width: int = 512):
        super().__init__()
        self.dict_output = dict_output
        # Two 512-wide layers: a step of a few ms on one CPU thread. Passing a batch from a loader worker costs
        # ~1 ms whatever the model; with a 1 ms model that was 40 % of the time, a loader data-bound for real.
        self.net = nn.Sequential(
            *(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()),
            *(nn.Dropout(0.1), nn.Linear(width, CLASSES)),
        )
        self.detach = False  # the planted "detached" fault: the output cut from the graph

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        logits = self.net(features)
        if self.detach:
            logits = logits.detach().requires_grad_()
        if not self.dict_output:
            return logits
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


@dataclass
class Plan:
    """A fault planted at ``step``: what the loop does differently from then on (or at that step only)."""

    fault: str | None = None
    step: int = 0

    def on(self, step: int, once: bool = False) -> bool:
        return self.fault is not None and (step == self.step if once else step >= self.step)


class Shards(IterableDataset):  # type: ignore[type-arg]
    """The data as two shards, one per loader worker."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int, batches: int):
        self.x, self.y, self.seed, self.batches = x, y, seed, batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        g = torch.Generator().manual_seed(self.seed * 100 + worker)
        for _ in range(self.batches // workers + 1):
            idx = torch.randint(0, len(self.x), (BATCH,), generator=g)
            yield self.x[idx], self.y[idx]


def problem(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and validation sets: a noisy linear 4-class problem, learnable to ~85 %."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    x = torch.randn(N + 512, FEATURES, generator=g)
    y = (x @ w + 0.7 * torch.randn(N + 512, CLASSES, generator=g)).argmax(1)
    return x[:N], y[:N], x[N:], y[N:]


def scheduler(name: str, optimizer: torch.optim.Optimizer, steps: int) -> Any:
    if name == "constant":
        return None
    if name == "warmup_cosine":
        warm = steps // 10

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, steps - warm))))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    if name == "step_decay":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, steps // 3), gamma=0.1)
    if name == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1)
    raise ValueError(f"unknown schedule {name!r}: one of {', '.join(SCHEDULES)}")


def run_style(
    style: str,
    schedule: str,
    seed: int,
    *,
    steps: int = 1000,
    run_dir: str | Path = "runs",
    fault: str | None = None,
    fault_step: int | None = None,
) -> tuple[list[dict[str, Any]], int | None]:
    """Train; the run's ledger records, and the step the fault began at (None for a healthy run)."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}: one of {', '.join(STYLES)}")
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    rng = random.Random(seed)  # noqa: S311 - where to plant a fault, not a secret
    plan = Plan(fault, fault_step if fault_step is not None else rng.randrange(steps // 4, steps // 2))
    torch.manual_seed(seed)
    x, y, vx, vy = problem(seed)
    # The iterable style's loader workers cost ~2 ms a batch in the training process (torch passes each
    # tensor's shared memory through its worker, which must be scheduled): 45 % of a 512-wide step, over half
    # on a loaded machine, a loader data-bound for real in a run called healthy. Its steps are made ~4 ms.
    # (Every style at 768 overfits now and then within its 1,000 steps: the accumulate style sees 4 epochs.)
    model = Classifier(dict_output=style == "dict", width=768 if style == "iterable" else 512)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    accumulate = 2 if style == "accumulate" else 1
    sched = scheduler(schedule, optimizer, steps)
    scaler = torch.amp.GradScaler("cpu") if style == "autocast" else None
    watch = tuiwatch.Watch(
        model,
        optimizer,
        name=f"style-{style}-{schedule}-{fault or 'healthy'}",
        run_dir=run_dir,
        scaler=scaler,
        seed=seed,
        system=False,
        quiet=True,
        on_nonfinite="warn",  # a planted fault is named by the rules, not stopped: the matrix reads what they say
        step_per="optimizer" if accumulate > 1 else "batch",
    )
    g = torch.Generator().manual_seed(seed)

    # The planted slow loader, from the fault's step on: a wait per batch of twice the step time measured
    # before it (20 ms at least). A fixed 20 ms was under half of an autocast step on a loaded machine: a
    # loader that slow is not the bottleneck there, and data-bound rightly said nothing.
    slow = [0.0]
    step_times: list[float] = []

    def slowed(loader: Any) -> Iterator[Any]:
        for batch in loader:
            if slow[0]:
                time.sleep(slow[0])  # inside the loader's iteration: what watch.batches() times as data wait
            yield batch

    def batches() -> Iterator[tuple[Any, torch.Tensor]]:
        if style == "iterable":
            loader: Any = DataLoader(Shards(x, y, seed, steps * accumulate), batch_size=None, num_workers=2)
        else:
            loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=g, drop_last=True)
        while True:
            yield from watch.batches(slowed(loader) if fault == "slow-loader" else loader)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if slow[0]:
            time.sleep(slow[0])
        ix = torch.randint(0, N, (BATCH,), generator=g)
        return x[ix], y[ix], ix

    def planted(step: int, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if plan.fault == "nan-input" and plan.on(step, once=True):
            xb = xb.clone()
            xb[0, 0] = math.nan
        if plan.fault == "wrong-units" and plan.on(step, once=True):
            xb = xb * 1000
        if plan.fault == "shuffled-labels" and plan.on(step):
            yb = torch.randint(0, CLASSES, yb.shape, generator=g)  # labels no longer follow the inputs
        model.detach = plan.fault == "detached" and plan.on(step)
        return xb, yb

    def forward_loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=style == "autocast"):
            if style == "dict":
                out = model(features=xb, labels=yb)
                return out["loss"]  # type: ignore[no-any-return]
            return nn.functional.cross_entropy(model(xb).float(), yb)

    def update(step: int) -> None:
        if plan.fault == "lr-zero" and plan.on(step):
            for group in optimizer.param_groups:
                group["lr"] = 0.0
        if scaler is not None:
            scaler.unscale_(optimizer)
        watch.clip_grad_norm_(1.0)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if sched is not None and schedule != "plateau" and not (plan.fault == "lr-zero" and plan.on(step)):
            sched.step()

    def validate(step: int) -> None:
        train_mode = plan.fault == "eval-train-mode" and plan.on(step)
        with watch.validation():
            model.train(train_mode)
            with torch.no_grad():
                val = nn.functional.cross_entropy(model(vx) if style != "dict" else model(vx)["logits"], vy)
            model.train()
            watch.log(val_loss=val)
        if schedule == "plateau" and sched is not None:
            sched.step(float(val))

    source = batches() if style != "get_batch" else None
    if style == "get_batch":
        with watch.fetching():
            X, Y, ix = get_batch()
    for step in range(steps):
        started = time.perf_counter()
        if plan.fault == "slow-loader" and plan.on(step) and not slow[0]:
            slow[0] = max(0.02, 2 * statistics.median(step_times[-50:] or [0.0]))
        for _ in range(accumulate):
            if source is not None:
                xb, yb = next(source)
            else:
                watch.step(batch=(X, Y), ids=ix)
                xb, yb = X, Y
            xb, yb = planted(step, xb, yb)
            loss = forward_loss(xb, yb)
            watch.log(loss=loss)
            if style == "get_batch":
                with watch.fetching():
                    X, Y, ix = get_batch()
            scaled = loss / accumulate
            (scaler.scale(scaled) if scaler is not None else scaled).backward()  # type: ignore[no-untyped-call]
        update(step)
        step_times.append(time.perf_counter() - started)
        if (step + 1) % 100 == 0:
            validate(step)
    watch.close()
    assert watch.run_dir is not None
    return list(read_ledger(watch.run_dir)), plan.step if fault else None
