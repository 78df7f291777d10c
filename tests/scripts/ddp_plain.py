"""A DDP script as torchrun users write it (gloo on the CPU), knowing nothing of tuiwatch.

torchrun --nproc_per_node=2 -m tuiwatch run tests/scripts/ddp_plain.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = TensorDataset(x, (x[:, 0] > x[:, 1]).long())
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()
    print(f"rank {rank} of {os.environ.get('WORLD_SIZE')} done", flush=True)


if __name__ == "__main__":
    main()
