"""An FSDP2 job (``fully_shard``, gloo, CPU ranks) with the three lines: each rank holds shards of the weights.

    torchrun --nproc_per_node=2 tests/scripts/fsdp_train.py RUN_DIR OUT_DIR

Each rank writes to OUT_DIR/rank<k>.json the norms it can read without a collective (its shard's gradient norm
at each step) and the model's (the all-reduced total, as torch's ``get_total_norm`` gives it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import tuiwatch

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
shard_norms, model_norms = [], []
with tuiwatch.Watch(model, optimizer, name="fsdp", run_dir=sys.argv[1], system=False, quiet=True) as watch:
    for _ in range(4):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        watch.step(x)
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        loss.backward()
        grads = [cast(DTensor, p.grad) for p in model.parameters() if p.grad is not None]
        shard_norms.append(float(torch.linalg.vector_norm(torch.cat([d.to_local().flatten() for d in grads]))))
        model_norms.append(float(cast(DTensor, torch.nn.utils.get_total_norm(grads)).full_tensor()))
        optimizer.step()
        optimizer.zero_grad()
Path(sys.argv[2], f"rank{rank}.json").write_text(json.dumps({"shard": shard_norms, "model": model_norms}))
dist.destroy_process_group()
