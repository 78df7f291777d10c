"""A tiny GPT-2 trained by the Hugging Face ``Trainer`` on synthetic tokens, with tuiwatch's one line.

    python tests/scripts/hf_train.py --out DIR --run-dir RUNS [--steps 20] [--resume CHECKPOINT] [--logging-steps 5]

Built from a config (nothing is downloaded). The Trainer's own log history is written to ``DIR/log_history.json``
for the tests to hold the ledger against.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import tuiwatch


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences of 16 tokens that repeat a short pattern (learnable), with padding at the end of some."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 4), generator=g).repeat(1, 4)
        self.mask = torch.ones(n, 16, dtype=torch.long)
        self.mask[::3, 12:] = 0  # every third sequence ends in 4 padding tokens

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.ids[i].masked_fill(self.mask[i] == 0, -100)
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": labels}


class PoisonAt(TrainerCallback):  # type: ignore[misc]
    """A NaN written into one embedding weight before optimizer step ``step``: the run's loss turns NaN there."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.global_step == self.step:
            with torch.no_grad():
                model.transformer.wte.weight[:, 0] = float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--resume", default=None)
    p.add_argument("--logging-steps", type=int, default=5)
    p.add_argument("--nan-at", type=int, default=-1, help="poison the weights before this optimizer step")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=3e-3,
        max_grad_norm=1.0,
        logging_steps=args.logging_steps,
        eval_strategy="steps",
        eval_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    callback = tuiwatch.hf.TuiwatchCallback(run_dir=args.run_dir, name="hf-gpt2")
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Tokens(256, 0),
        eval_dataset=Tokens(32, 1),
        callbacks=[callback, PoisonAt(args.nan_at)],
    )
    trainer.train(resume_from_checkpoint=args.resume)
    history: list[dict[str, Any]] = trainer.state.log_history
    (Path(args.out) / "log_history.json").write_text(json.dumps(history))
    print(f"trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
