"""A DDP loop without an optimizer or marks (the weights updated by hand), with a Watch: gloo on the CPU.

    torchrun --nproc_per_node=2 tests/scripts/ddp_by_hand.py --run-dir DIR

Each rank prints, as one JSON line, the gradient norm it saw after each backward: DDP's all-reduced one, the same
on every rank.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import tuiwatch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    watch = tuiwatch.Watch(model, name="byhand", run_dir=args.run_dir, quiet=True, system=False)
    g = torch.Generator().manual_seed(rank)  # each rank its own batches: their local gradients differ
    norms = []
    for _ in range(4):
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in grads]))))
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)
    watch.close()
    # One write with its newline (under 4 KiB: whole on a pipe): print() writes the line and its end apart, and under
    # PYTHONUNBUFFERED the two ranks' lines came out as '{...}{...}' and two newlines.
    sys.stdout.write(json.dumps({"rank": rank, "norms": norms}) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
