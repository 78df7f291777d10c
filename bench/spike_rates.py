"""loss-spike's false-alarm and detection rates on real noisy runs (issue 15), printed as a table for docs/rules.md.

Each run trains a small classifier the way a healthy noisy run does (SGD
with momentum 0.9, lr 0.1 decayed x0.1 every 300 steps, dropout 0.3,
clipping at 1.0) for 1,000 steps at three noise levels (batch 4 on separable
data, batch 8 with label noise, batch 16 with more): once as it is, once with
one batch in the wrong units (features x1000) at a seeded step. False alarms
are warning alerts on the healthy runs per 1,000 steps; a planted batch is
detected when the alert is at its step. A planted batch whose loss is not a
spike (the model saturates and scores it 0) is counted apart::

    python bench/spike_rates.py [--seeds 8]
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from tuiwatch.rules import Diagnosis

NOISE = {"batch 4, separable": (4, 0.0), "batch 8, label noise 0.3": (8, 0.3), "batch 16, label noise 0.8": (16, 0.8)}


def losses(seed: int, batch: int, noise: float, bad_step: int | None, steps: int = 1000) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    n = 2048
    x = torch.randn(n, 20, generator=g)
    y = (x @ torch.randn(20, 4, generator=g) + noise * torch.randn(n, 4, generator=g)).argmax(1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=300, gamma=0.1)
    out = []
    for step in range(steps):
        idx = torch.randint(0, n, (batch,), generator=g)
        xb = x[idx] * (1000 if step == bad_step else 1)
        loss = nn.functional.cross_entropy(model(xb), y[idx])
        out.append(loss.item())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return out


def alerts(values: list[float]) -> list[int]:
    records = [{"kind": "step", "step": i, "loss": v} for i, v in enumerate(values)]
    return [a["step"] for a in Diagnosis(["loss-spike"]).run(records) if a["severity"] != "info"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| runs | healthy steps | false alarms per 1,000 steps | planted spikes detected | planted batches scored 0 |"
    )
    print("|---|---|---|---|---|")
    for name, (batch, noise) in NOISE.items():
        false = steps = detected = planted = saturated = 0
        for seed in range(args.seeds):
            healthy = losses(seed, batch, noise, None)
            false += len(alerts(healthy))
            steps += len(healthy)
            bad = 200 + 37 * seed
            faulty = losses(seed, batch, noise, bad)
            if faulty[bad] == 0.0:
                saturated += 1
                continue
            planted += 1
            detected += bad in alerts(faulty)
        rate = 1000 * false / steps
        print(f"| {name} x {args.seeds} seeds | {steps:,} | {rate:.2f} | {detected}/{planted} | {saturated} |")
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
