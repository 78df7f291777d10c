"""What a large CPU batch's finiteness probe costs the training thread: at once, or on the publisher thread.

A GPU run whose loader yields float images on the CPU (torchvision's
ImageNet pipeline: 256 × 3 × 224 × 224, 154 MB) had each batch summed on the
training thread before its forward: ~10 ms of a core, while the GPU waited.
Since late_probes.py the publisher thread sums it when it builds the step's
record. This machine has no GPU: the step here is a small model's forward and
backward on a slice of the batch, then ``--device-ms`` of waiting with the GIL
released, standing in for a synchronising read of a GPU step's loss (what
``loss.item()`` does in pytorch/examples' imagenet loop). Three arms in rotating
order in one process, the same batches: bare, a Watch that probes at once (the
way before: ``LateProbes.on`` off), and a default Watch, each timed after its
first ``SETTLED`` steps (the warm-up). Reported: added wall and
training-thread CPU a step over the bare loop, and the time the training thread
took for the batch's facts (``BatchInfo``, which holds the probe) a step, the
median of the paired rounds [interquartile range], with the load average.

    python bench/large_batches.py [--rounds 7] [--batch 64] [--steps 80] [--device-ms 20]
    python bench/large_batches.py --side 32 --model cnn --device-ms 0 --steps 300   # overhead.py's CNN
    python bench/large_batches.py --model mlp512 --batch 256 --device-ms 0 --steps 300   # its 3x512 MLP
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from overhead import CASES
from torch import nn

import tuiwatch.publisher.steps as steps_module
from tuiwatch.publisher.late_probes import WARMUP
from tuiwatch.publisher.measure import BatchInfo
from tuiwatch.publisher.watch import Watch

ARMS = ("bare", "at once", "late")
# Steps timed from here on: a run's first WARMUP large batches are probed at once in either arm (late_probes.py).
SETTLED = WARMUP + 4


def make_model(kind: str) -> nn.Module:
    if kind == "cnn":  # bench/overhead.py's CNN, on the whole 32x32 image
        return CASES[2].make_model()
    if kind == "mlp512":  # bench/overhead.py's 3x512 MLP, on rows of 512 features
        return CASES[1].make_model()
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))


def run_arm(
    arm: str, batches: list[tuple[torch.Tensor, torch.Tensor]], device_s: float, run_dir: Path, kind: str = "crop"
) -> tuple[float, float, float]:
    """µs a step of wall and training-thread CPU, and the p50 of the batch's facts (BatchInfo) on that thread."""
    torch.manual_seed(0)
    model = make_model(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = None if arm == "bare" else Watch(model, optimizer, run_dir=run_dir, system=False, quiet=True)
    if watch is not None and arm == "at once":
        watch._tracker.late.on = False
    facts: list[float] = []

    def timed_facts(*args: Any) -> BatchInfo:
        t0 = time.perf_counter()
        info = BatchInfo(*args)
        facts.append(time.perf_counter() - t0)
        return info

    steps_module.BatchInfo = timed_facts  # type: ignore[assignment,misc]
    source = iter(batches) if watch is None else watch.batches(batches)
    for i, (x, y) in enumerate(source):
        if i == SETTLED:
            wall, cpu = time.perf_counter(), time.thread_time()
            facts.clear()
        loss = nn.functional.cross_entropy(model(x[:, :, :16, :16] if kind == "crop" else x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(device_s)  # the wait for the device's step, the GIL released
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    steps_module.BatchInfo = BatchInfo  # type: ignore[misc]
    if watch is not None:
        watch.close()
    timed = len(batches) - SETTLED
    return wall / timed * 1e6, cpu / timed * 1e6, statistics.median(facts) * 1e6 if facts else 0.0


def median_iqr(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.0f} [{q[0]:.0f}, {q[2]:.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--device-ms", type=float, default=20.0)
    parser.add_argument("--side", type=int, default=224, help="the images' side")
    parser.add_argument(
        "--model",
        choices=("crop", "cnn", "mlp512"),
        default="crop",
        help="a small MLP on a 16x16 crop, the CNN (--side 32), or the 3x512 MLP (rows of 512 features, no images)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    shape = (512,) if args.model == "mlp512" else (3, args.side, args.side)
    batches = [
        (
            torch.randn(args.batch, *shape, generator=g),
            torch.randint(0, 10, (args.batch,), generator=g),
        )
        for _ in range(args.steps)
    ]
    mb = batches[0][0].nbytes / 2**20
    load0 = os.getloadavg()[0]
    added: dict[str, list[tuple[float, float, float]]] = {a: [] for a in ARMS[1:]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ARMS[r % 3 :] + ARMS[: r % 3]
            got = {a: run_arm(a, batches, args.device_ms / 1000, Path(tmp) / f"{r}-{a}", args.model) for a in order}
            for a in ARMS[1:]:
                added[a].append((got[a][0] - got["bare"][0], got[a][1] - got["bare"][1], got[a][2]))
            print(
                f"round {r + 1}: bare {got['bare'][0] / 1000:.2f} ms a step; added wall "
                + ", ".join(f"{a} {added[a][-1][0]:.0f} µs" for a in ARMS[1:])
            )
    load1 = os.getloadavg()[0]
    print(
        f"\nbatch {args.batch}×{'×'.join(map(str, shape))} float32 ({mb:.2f} MiB) on the CPU, {args.steps} steps a "
        f"round, {args.device_ms:g} ms of device wait a step, one torch thread; load average {load0:.2f} → {load1:.2f}"
    )
    print("| arm | added wall µs a step | added training-thread CPU µs a step | the batch's facts p50 µs |")
    print("|---|---|---|---|")
    for a in ARMS[1:]:
        print(f"| {a} | " + " | ".join(median_iqr([v[i] for v in added[a]]) for i in range(3)) + " |")


if __name__ == "__main__":
    main()
