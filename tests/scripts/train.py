"""A plain training script with tuiwatch's three lines, driven by the tests.

It writes what it computed itself (loss, lr, pre-clip grad norm, sample ids)
to ``--truth`` so that tests can compare the ledger with the loop's own view.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tuiwatch


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, item_sleep_s: float):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 2, generator=g)
        self.y = (self.x[:, 0] > self.x[:, 1]).long()
        self.item_sleep_s = item_sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.item_sleep_s:
            time.sleep(self.item_sleep_s)  # a slow loader of known cost
        return self.x[i], self.y[i], torch.tensor(i)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--name", default="train")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--item-sleep", type=float, default=0.0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--truth", default=None)
    p.add_argument("--no-close", action="store_true", help="leave closing to interpreter exit")
    p.add_argument("--stall-s", type=float, default=5.0)
    p.add_argument("--resume", default=None, help="a checkpoint to restore before training")
    p.add_argument("--stop-mode", default="flag", choices=("flag", "raise"))
    p.add_argument("--width", type=int, default=32, help="hidden width (a larger state dict)")
    p.add_argument("--max-file-bytes", type=int, default=None, help="RLIMIT_FSIZE: a disk that fills up")
    p.add_argument("--tcp", default=None, help="'on' (loopback, any port) or HOST:PORT: Watch(tcp=...)")
    p.add_argument("--hang-disk-at-step", type=int, default=None, help="every ledger write blocks from then on")
    p.add_argument("--disk-back-at-step", type=int, default=None, help="lift that limit: space comes back")
    args = p.parse_args()
    if args.max_file_bytes:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.max_file_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    torch.set_num_threads(1)  # bit-identical losses between a run and its resumed copy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, args.width), nn.ReLU(), nn.Linear(args.width, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    loader = DataLoader(
        SlowDataset(args.samples, args.item_sleep),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(1),
    )
    watch = tuiwatch.Watch(
        model,
        opt,
        name=args.name,
        scheduler=sched,
        run_dir=args.run_dir,
        viewer_stall_s=args.stall_s,
        stop=args.stop_mode,
        tcp=True if args.tcp == "on" else args.tcp or False,
    )
    step = watch.restore(args.resume).step if args.resume else 0
    truth = open(args.truth, "w") if args.truth else None
    try:
        train(args, watch, model, opt, sched, loader, truth, step)
    except tuiwatch.StopRequested as exc:
        print(f"stopped: {exc}", flush=True)
    if truth:
        truth.close()
    print("loop done", flush=True)
    if not args.no_close:
        watch.close()


def hang_the_disk() -> None:
    """From now on every write and fsync of the ledger blocks forever, as on a dead NFS mount."""
    import os
    import threading

    import tuiwatch.ledger.writer as writer_module

    never = threading.Event()

    class HungOs:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        def write(self, fd: int, data: Any) -> int:
            never.wait()
            return 0

        def fsync(self, fd: int) -> None:
            never.wait()

    writer_module.os = HungOs()  # type: ignore[assignment,attr-defined]


def train(
    args: argparse.Namespace,
    watch: tuiwatch.Watch,
    model: nn.Module,
    opt: Any,
    sched: Any,
    loader: DataLoader[Any],
    truth: TextIO | None,
    step: int,
) -> None:
    while step < args.steps and not watch.should_stop:
        for x, y, ids in watch.batches(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            grads = [q.grad for q in model.parameters() if q.grad is not None]
            pre_clip = float(torch.nn.utils.get_total_norm(grads))
            if args.clip is not None:
                watch.clip_grad_norm_(args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if truth:
                lr = [g["lr"] for g in opt.param_groups]
                row = {"step": step, "loss": loss.item(), "lr": lr, "grad_norm": pre_clip, "ids": ids.tolist()}
                truth.write(json.dumps(row) + "\n")
            sched.step()
            step += 1
            if step == args.hang_disk_at_step:
                hang_the_disk()
            if step == args.disk_back_at_step:
                import resource

                hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
                resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
            if args.step_sleep:
                time.sleep(args.step_sleep)  # paces the run so a test can act mid-run
            if step >= args.steps or watch.should_stop:
                break
        with watch.validation(), torch.no_grad():
            model.eval()
            watch.log(val_loss=nn.functional.cross_entropy(model(loader.dataset.x), loader.dataset.y))  # type: ignore[attr-defined]
        model.train()


if __name__ == "__main__":
    main()
