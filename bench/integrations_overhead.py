"""What each integration adds to a step, against the same training without it, side by side in one run.

    python bench/integrations_overhead.py [--rounds 5] [--steps 1000] [--only plain,lightning,hf]

Arms, each a fresh process, rotating order within a round:
- plain: a DataLoader loop on a 16-32-2 MLP bare; the same file under ``tuiwatch run`` (nothing edited); the
  loop with a Watch's three lines;
- lightning: a LightningModule of the same MLP fitted bare; with ``tuiwatch.lightning.TuiwatchCallback``;
- hf: a 2-layer GPT-2 (n_embd 32) under the Hugging Face Trainer bare; with ``tuiwatch.hf.TuiwatchCallback``.

Each process times its own steps after a warm-up (a timing callback in the framework arms, present in both):
wall time a step and the training thread's CPU time a step (``time.thread_time``). Printed per arm: medians over
the rounds, and what it adds to its bare arm, measured in the same rounds. The load average is printed at the
start and the end: read the differences and ratios, not the absolute times.
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
ARMS = {
    "plain": ("bare", "run", "watch"),
    "lightning": ("bare", "callback"),
    "hf": ("bare", "callback"),
}


class Clock:
    """Wall and training-thread CPU time from the warm-up's end to the last step."""

    def __init__(self) -> None:
        self.steps = 0
        self.wall0 = self.cpu0 = 0.0

    def tick(self) -> None:
        if self.steps == WARMUP:
            self.wall0, self.cpu0 = time.perf_counter(), time.thread_time()
        self.steps += 1

    def result(self) -> dict[str, float]:
        n = self.steps - WARMUP
        return {
            "wall_us": (time.perf_counter() - self.wall0) / n * 1e6,
            "cpu_us": (time.thread_time() - self.cpu0) / n * 1e6,
        }


def mlp_data(steps: int) -> Any:
    """Inputs of 16 and two classes a linear teacher gives them (learnable: the watched run raises no alert)."""
    import torch
    from learnable import teacher_labels
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn((steps + WARMUP) * 32, 16, generator=g)
    return TensorDataset(x, teacher_labels(x, 2, g))


def plain(args: argparse.Namespace, clock: Clock) -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(mlp_data(args.steps), batch_size=32, shuffle=True)
    watch = None
    if args.arm == "watch":
        import tuiwatch

        watch = tuiwatch.Watch(model, optimizer, name="bench-watch", run_dir=args.run_dir, quiet=True)
    for x, y in watch.batches(loader) if watch is not None else loader:
        clock.tick()
        loss = nn.functional.cross_entropy(model(x), y)
        if watch is not None:
            watch.log(loss=loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if watch is not None:
        watch.close()


def lightning(args: argparse.Namespace, clock: Clock) -> None:
    import pytorch_lightning as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    import tuiwatch

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Timing(pl.Callback):
        def on_train_batch_start(self, *_: Any) -> None:
            clock.tick()

    callbacks: list[Any] = [Timing()]
    if args.arm == "callback":
        callbacks.append(tuiwatch.lightning.TuiwatchCallback(run_dir=args.run_dir, name="bench-lightning"))
    loader = DataLoader(mlp_data(args.steps), batch_size=32, shuffle=True)
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, default_root_dir=args.run_dir,
    )  # fmt: skip
    trainer.fit(Module(), loader)


def hf(args: argparse.Namespace, clock: Clock) -> None:
    import torch
    from learnable import counting_tokens
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    import tuiwatch

    class Timing(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            clock.tick()

    ids = counting_tokens((args.steps + WARMUP) * 4, 16, 64, torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    callbacks: list[Any] = [Timing()]
    if args.arm == "callback":
        callbacks.append(tuiwatch.hf.TuiwatchCallback(run_dir=args.run_dir, name="bench-hf"))
    training = TrainingArguments(
        output_dir=args.run_dir, max_steps=args.steps + WARMUP, per_device_train_batch_size=4, logging_steps=100,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks).train()


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    clock = Clock()
    {"plain": plain, "lightning": lightning, "hf": hf}[args.family](args, clock)
    print(json.dumps(clock.result()))


def alerts_in(run_dir: str) -> list[str]:
    """The warning and critical alerts of the ledgers under ``run_dir``, as rule@step."""
    from tuiwatch.ledger.reader import read_ledger

    return [
        f"{r['rule']}@{r['step']}"
        for ledger in sorted(Path(run_dir).rglob("ledger.jsonl"))
        for r in read_ledger(ledger)
        if r.get("kind") == "alert" and r.get("severity") != "info"
    ]


def measure(family: str, arm: str, args: argparse.Namespace, run_dir: str) -> dict[str, float]:
    me = str(Path(__file__).resolve())
    options = ["--worker", "--family", family, "--arm", arm, "--steps", str(args.steps), "--run-dir", run_dir]
    prefix = [sys.executable, "-m", "tuiwatch", "run", "--run-dir", run_dir] if arm == "run" else [sys.executable]
    env = {**os.environ, "TUIWATCH_QUIET": "1"}
    done = subprocess.run([*prefix, me, *options], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{family}/{arm} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--only", default=",".join(ARMS), help="families to measure (default: all)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--family", choices=tuple(ARMS), default="plain", help=argparse.SUPPRESS)
    p.add_argument("--arm", default="bare", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    families = [f for f in args.only.split(",") if f]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.steps} steps")
    results: dict[tuple[str, str], list[dict[str, float]]] = {(f, a): [] for f in families for a in ARMS[f]}
    alerts: dict[tuple[str, str], list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for family in families:
                arms = ARMS[family]
                for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                    run_dir = tempfile.mkdtemp(dir=tmp)
                    results[family, arm].append(measure(family, arm, args, run_dir))
                    alerts.setdefault((family, arm), []).extend(alerts_in(run_dir))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for (family, arm), found in alerts.items():
        if arm != "bare":  # a healthy run is what a user has: an alert here means the arm measures something else
            print(f"alerts raised ({family}/{arm}, all rounds): {', '.join(found) or 'none'}")
    print(f"{'family':<11}{'arm':<10}{'wall µs/step':>14}{'added':>9}{'thread CPU µs/step':>20}{'added':>9}")
    for family in families:
        bare = results[family, "bare"]
        for arm in ARMS[family]:
            runs = results[family, arm]
            wall, cpu = (statistics.median(x[k] for x in runs) for k in ("wall_us", "cpu_us"))
            added_wall = statistics.median(x["wall_us"] - b["wall_us"] for x, b in zip(runs, bare, strict=True))
            added_cpu = statistics.median(x["cpu_us"] - b["cpu_us"] for x, b in zip(runs, bare, strict=True))
            print(f"{family:<11}{arm:<10}{wall:>14.1f}{added_wall:>9.1f}{cpu:>20.1f}{added_cpu:>9.1f}")


if __name__ == "__main__":
    main()
