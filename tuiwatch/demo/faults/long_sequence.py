"""A sequence so long that attention cannot be allocated.

A tiny attention model trains on sequences of 16 tokens; at step 20 one batch
holds 2 sequences of 524,288 tokens, and the (2, L, L) score matrix (2 TiB)
cannot be allocated. Expected: ``oom`` at step 20 with the batch shape, then
the original exception, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from tuiwatch.demo.loop import Outcome, train

RULE = "oom"
STARTS = 20


class TinyAttention(nn.Module):
    def __init__(self, width: int = 8, classes: int = 2):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5  # (batch, L, L): quadratic in the length
        out: torch.Tensor = self.out((scores.softmax(-1) @ v).mean(1))
        return out


def batches(g: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for step in range(10_000):
        length = 1 << 19 if step == STARTS else 16  # the bug: no cap on the sequence length
        x = torch.randn(2 if step == STARTS else 32, length, 8, generator=g)
        yield x, (x[:, 0, 0] > 0).long()


class Sequences:
    def __init__(self, seed: int):
        self.seed = seed

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return batches(torch.Generator().manual_seed(self.seed))


def run(steps: int = 1000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    torch.manual_seed(seed)
    model = TinyAttention()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        optimizer,
        Sequences(seed),
        name="fault-long-sequence",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        expected=(RuntimeError, MemoryError),
        **kw,
    )


if __name__ == "__main__":
    print(run().error)
