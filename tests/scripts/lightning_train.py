"""A LightningModule on synthetic data, trained by a Lightning Trainer with tuiwatch's one line.

    python tests/scripts/lightning_train.py --root DIR --run-dir RUNS [--epochs 2] [--accumulate 2]
        [--clip 1.0] [--nan-at STEP] [--devices 2] [--resume CKPT] [--checkpoint-dir DIR] [--lbfgs] [--muon]
        [--truth FILE]

``LIGHTNING_NAMESPACE=lightning.pytorch`` trains with that namespace's Trainer (default ``pytorch_lightning``).
The module writes what it computed to ``--truth`` (each training batch's loss as it was backpropagated, and
Lightning's own ``grad_norm`` total before clipping at each optimizer step), for the tests to hold the ledger
against. ``--nan-at`` plants a NaN in the inputs of that optimizer step's first batch. ``--muon`` trains by
manual optimization with two optimizers, torch's ``Muon`` for the matrices and ``AdamW`` for the biases, and
writes how far each batch's two steps moved the weights.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch

pl: Any = importlib.import_module(os.environ.get("LIGHTNING_NAMESPACE", "pytorch_lightning"))
grad_norm = importlib.import_module(f"{pl.__name__}.utilities").grad_norm


class Classifier(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, accumulate: int, nan_at: int, lbfgs: bool = False, muon: bool = False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.accumulate, self.nan_at, self.lbfgs = accumulate, nan_at, lbfgs
        self.automatic_optimization = not muon
        self.updates: list[float] = []  # --muon: how far each batch's optimizer steps moved the weights
        self.losses: list[float] = []
        self.norms: list[float] = []
        self.loss_steps: list[int] = []  # the global step of each loss and norm: LBFGS makes several a step
        self.norm_steps: list[int] = []
        self.val_losses: list[float] = []
        self.firsts: list[list[float]] = []  # each training batch's first feature: which samples it holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.firsts.append(x[:, 0].tolist())
        if self.global_step == self.nan_at and batch_idx % self.accumulate == 0:
            x = x.clone()
            x[0, 0] = math.nan
        loss = nn.functional.cross_entropy(self(x), y)
        self.losses.append(loss.item() / self.accumulate)  # Lightning divides by the accumulation
        self.loss_steps.append(self.global_step)
        self.log("train_loss", loss)
        if not self.automatic_optimization:
            before = [p.detach().clone() for p in self.parameters()]
            optimizers = self.optimizers()
            self.manual_backward(loss)
            for optimizer in optimizers:
                optimizer.step()
            for optimizer in optimizers:
                optimizer.zero_grad()
            moved = sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(self.parameters(), before, strict=True))
            self.updates.append(math.sqrt(moved))
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        # Empty after on_nonfinite="skip" dropped this step's gradients (callbacks' hooks run before the module's).
        self.norms.append(float(grad_norm(self, norm_type=2).get("grad_2.0_norm_total", math.nan)))
        self.norm_steps.append(self.global_step)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_losses.append(self.trainer.callback_metrics["val_loss"].item())

    def configure_optimizers(self) -> Any:
        if not self.automatic_optimization:  # Muon for the matrices, AdamW for the rest: torch's documented pairing
            matrices = [p for p in self.parameters() if p.ndim == 2]
            rest = [p for p in self.parameters() if p.ndim != 2]
            return [torch.optim.AdamW(rest, lr=1e-3), torch.optim.Muon(matrices, lr=0.02)]
        if self.lbfgs:  # Lightning hands step() a closure, which LBFGS calls up to max_iter times
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, :3].argmax(dim=1)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--on-nonfinite", default="stop")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--resume", default=None)
    p.add_argument("--checkpoint-dir", default=None, help="Lightning's own ModelCheckpoint: one checkpoint an epoch")
    p.add_argument("--lbfgs", action="store_true", help="LBFGS (a closure evaluated several times a step)")
    p.add_argument("--muon", action="store_true", help="manual optimization with Muon and AdamW")
    p.add_argument("--truth", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    model = Classifier(args.accumulate, args.nan_at, args.lbfgs, args.muon)
    checkpoints = []
    if args.checkpoint_dir:
        checkpoints.append(pl.callbacks.ModelCheckpoint(dirpath=args.checkpoint_dir, save_top_k=-1, every_n_epochs=1))
    trainer = pl.Trainer(
        default_root_dir=args.root,
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.clip,
        callbacks=[
            tuiwatch.lightning.TuiwatchCallback(run_dir=args.run_dir, name="lit", on_nonfinite=args.on_nonfinite),
            *checkpoints,
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(checkpoints),
        logger=False,
        num_sanity_val_steps=1,
    )
    train = DataLoader(data(512, 0), batch_size=32, shuffle=True)
    val = DataLoader(data(128, 1), batch_size=64)
    try:
        trainer.fit(model, train, val, ckpt_path=args.resume)
    finally:
        if args.truth and trainer.global_rank == 0:
            with open(args.truth, "w") as f:
                finite = all(bool(p.isfinite().all()) for p in model.parameters())
                truth = {"losses": model.losses, "norms": model.norms, "val_losses": model.val_losses, "finite": finite}
                truth.update(loss_steps=model.loss_steps, norm_steps=model.norm_steps, firsts=model.firsts)
                truth.update(updates=model.updates)
                json.dump({**truth, "global_step": trainer.global_step}, f)
    print(f"trained to step {trainer.global_step} with {pl.__name__}.Trainer", flush=True)


if __name__ == "__main__":
    main()
