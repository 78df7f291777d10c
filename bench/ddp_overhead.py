"""What a Watch costs each rank of a DDP job: torchrun, 2 ranks, gloo on the CPU, the same loop with and
without the Watch's three lines, the arms alternating, each rank timing its own steps.

    python bench/ddp_overhead.py [--rounds 3] [--steps 1000] [--width 64]

Per rank and arm: wall time a step and the training thread's CPU time a step (``time.thread_time``), medians
over the rounds, and the ratio watched / bare measured side by side. The load average is printed at the start
and the end: on a shared 2-CPU machine two ranks and a publisher thread each compete for the cores, so read
the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WARMUP = 50


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from learnable import teacher_labels
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import tuiwatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    width = args.width
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = (args.steps + WARMUP) * 32 * 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    data = TensorDataset(x, teacher_labels(x, 2, g))  # learnable: a healthy run, no rule active on it
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=True, seed=0))
    watch = tuiwatch.Watch(model, optimizer, name="ddp-bench", run_dir=args.run_dir) if args.arm == "watch" else None
    batches = watch.batches(loader) if watch is not None else iter(loader)
    wall0 = cpu0 = 0.0
    for i, (x, y) in enumerate(batches):
        if i == WARMUP:
            wall0, cpu0 = time.perf_counter(), time.thread_time()
        loss = nn.functional.cross_entropy(model(x), y)
        if watch is not None:
            watch.log(loss=loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    steps = i + 1 - WARMUP
    wall, cpu = (time.perf_counter() - wall0) / steps, (time.thread_time() - cpu0) / steps
    if watch is not None:
        watch.close()
    result = {"rank": rank, "arm": args.arm, "wall_us": wall * 1e6, "cpu_us": cpu * 1e6}
    Path(args.run_dir).parent.joinpath(f"{args.arm}-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run_arm(arm: str, args: argparse.Namespace, tmp: Path) -> dict[int, dict[str, float]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
    cmd += ["--worker", "--arm", arm, "--steps", str(args.steps), "--width", str(args.width)]
    cmd += ["--run-dir", str(tmp / "runs")]
    env = {**os.environ, "TUIWATCH_DIR": str(tmp / "sock")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        kept = Path(tempfile.mkstemp(prefix=f"tw-ddp-{arm}-", suffix=".log", dir="/tmp")[1])
        kept.write_text(f"exit status {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
        raise SystemExit(f"torchrun failed ({arm}, its whole output in {kept}): {done.stderr[-1500:]}")
    return {rank: json.loads((tmp / f"{arm}-{rank}.json").read_text()) for rank in (0, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--arm", default="bare")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--run-dir", default=None)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    got: dict[str, list[dict[int, dict[str, Any]]]] = {"bare": [], "watch": []}
    with tempfile.TemporaryDirectory(prefix="tw-ddp-", dir="/tmp") as tmp:
        os.makedirs(Path(tmp) / "sock", mode=0o700)
        for i in range(args.rounds):
            for arm in ("bare", "watch") if i % 2 == 0 else ("watch", "bare"):
                got[arm].append(run_arm(arm, args, Path(tmp)))
    print(f"\n2 ranks (gloo, CPU), MLP 16-{args.width}-2, batch 32, {args.steps} steps a round, {args.rounds} rounds\n")
    print("| rank | bare wall µs | watched wall µs | ratio | bare CPU µs | watched CPU µs | added CPU µs |")
    print("|---|---|---|---|---|---|---|")
    for rank in (0, 1):

        def med(arm: str, key: str, r: int = rank) -> float:
            return statistics.median(round_[r][key] for round_ in got[arm])

        bw, ww, bc, wc = med("bare", "wall_us"), med("watch", "wall_us"), med("bare", "cpu_us"), med("watch", "cpu_us")
        print(f"| {rank} | {bw:.0f} | {ww:.0f} | {ww / bw:.2f}× | {bc:.0f} | {wc:.0f} | {wc - bc:.0f} |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
