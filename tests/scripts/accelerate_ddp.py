"""A plain Accelerate loop as its users write it, run as several processes (torchrun), with tuiwatch's lines.

    torchrun --nproc_per_node=2 tests/scripts/accelerate_ddp.py --run-dir DIR --norms FILE

Each process writes what ``accelerator.clip_grad_norm_`` returned (the pre-clip norms) to FILE.<rank>.
"""

from __future__ import annotations

import argparse
import json

import accelerate
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--norms", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    acc = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(512, 2)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    norms: list[float] = []
    with tuiwatch.Watch(model, opt, name="acc", run_dir=args.run_dir) as watch:
        for _ in range(2):
            for xb, yb in watch.batches(loader):
                loss = nn.functional.cross_entropy(model(xb), yb)
                watch.log(loss=loss)
                acc.backward(loss)
                norms.append(float(acc.clip_grad_norm_(model.parameters(), 0.5)))
                opt.step()
                opt.zero_grad()
    with open(f"{args.norms}.{acc.process_index}", "w") as f:
        json.dump({"norms": norms, "distributed_type": str(acc.distributed_type)}, f)


if __name__ == "__main__":
    main()
