"""A DDP training script as torchrun users write it (gloo on the CPU), with tuiwatch's three lines.

    torchrun --nproc_per_node=2 tests/scripts/ddp_train.py --run-dir DIR [--slow-rank 1 --slow-s 0.02]

``--slow-rank`` makes that rank's loader sleep per batch: a straggler whose cause is its input.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import tuiwatch


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, sleep_s: float):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x[:, 0] > self.x[:, 1]).long()
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def collate_sleeping(sleep_s: float):  # one sleep per batch: a slow shard of known cost
    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if sleep_s:
            time.sleep(sleep_s)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    return collate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--name", default="ddp")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-s", type=float, default=0.0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each rank sleeps a step (a live job)")
    p.add_argument("--resume-from", default=None, help="a job directory whose checkpoint set to resume")
    p.add_argument("--resume-step", type=int, default=0, help="the checkpoint set's step count")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Points(2048, 0.0)
    sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]] = DistributedSampler(data, shuffle=True, seed=0)
    sleep_s = args.slow_s if rank == args.slow_rank else 0.0
    loader = DataLoader(data, batch_size=32, sampler=sampler, collate_fn=collate_sleeping(sleep_s))
    with tuiwatch.Watch(model, optimizer, name=args.name, run_dir=args.run_dir) as watch:
        if args.resume_from:  # each rank its own file of the set: its RNGs and its shard's position
            watch.restore(f"{args.resume_from}/rank{rank}/checkpoints/step-{args.resume_step}.pt")
        for epoch in range(watch.epoch, args.epochs):
            sampler.set_epoch(epoch)
            for x, y in watch.batches(loader):
                loss = nn.functional.cross_entropy(model(x), y)
                watch.log(loss=loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if watch.should_stop:
                    break
            if watch.should_stop:
                break
    dist.destroy_process_group()
    print(f"rank {rank} of {os.environ.get('WORLD_SIZE')} done", flush=True)


if __name__ == "__main__":
    main()
