"""``tuiwatch.hf.TuiwatchCallback`` on a real ``Trainer``: a tiny GPT-2 built from a config, synthetic tokens."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.ledger.chain import read_run
from tuiwatch.ledger.records import Record

from ..helpers import SCRIPTS, env_for, ledger_file, records
from .keys import checkpoint_then_stop

pytest.importorskip("transformers")
pytestmark = pytest.mark.integration

SCRIPT = SCRIPTS / "hf_train.py"


def train(out: Path, run_root: Path, socket_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--run-dir", str(run_root), *args]
    done = subprocess.run(cmd, env=env_for(socket_dir), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_every_optimizer_step_is_recorded_with_the_trainers_own_values(tmp_path: Path, socket_dir: Path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    train(out, runs, socket_dir, "--steps", "20", "--logging-steps", "5")
    ledger = ledger_file(runs)
    run_record = records(ledger, "run")[0]
    assert run_record["model"] == "GPT2LMHeadModel"
    assert run_record["optimizer"] == "AdamW in AcceleratedOptimizer"
    assert run_record["step_per"] == "optimizer"
    steps = records(ledger, "step")
    assert [s["step"] for s in steps] == list(range(20))  # every optimizer step, not only the logging ones
    history = json.loads((out / "log_history.json").read_text())
    logged = {h["step"]: h for h in history if "grad_norm" in h}
    assert sorted(logged) == [5, 10, 15, 20]
    for step, h in logged.items():  # the Trainer's global_step g is the ledger's step g - 1
        s = steps[step - 1]
        assert s["grad_norm"] == pytest.approx(h["grad_norm"], rel=1e-6)  # the pre-clip norm it clipped with
        assert s["lr"][0] == pytest.approx(h["learning_rate"], rel=1e-6)
        mean = statistics.fmean(x["loss"] for x in steps[step - 5 : step])  # the Trainer logs the interval's mean
        assert mean == pytest.approx(h["loss"], rel=1e-3)
    for s in steps:
        assert s["micro_batches"] == 2  # gradient_accumulation_steps=2: one record per optimizer step
        assert s["batch_shape"]["input_ids"] == [4, 16]
        assert 0 < s["tokens"] <= 2 * 4 * 16  # from attention_mask: its padding is not counted
        assert s["data_wait_s"] is not None
    assert any(s["tokens"] < 128 for s in steps)
    evals = records(ledger, "eval")
    evaluated = [h for h in history if "eval_loss" in h]
    assert [e["step"] for e in evals] == [9, 19]
    assert [e["loss"] for e in evals] == pytest.approx([h["eval_loss"] for h in evaluated])
    assert all(e["training"] is False for e in evals)
    assert records(ledger, "end")[-1]["reason"] == "finished"


def test_c_makes_the_trainers_checkpoint_that_resume_accepts_and_s_stops(tmp_path: Path, socket_dir: Path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--run-dir", str(runs), "--steps", "100000"]
    done = checkpoint_then_stop(cmd, socket_dir)
    saved, stopped = done.saved, done.stopped
    assert done.returncode == 0, done.err[-3000:]
    assert saved["ok"], saved
    assert stopped["ok"], stopped
    checkpoint = Path(saved["path"])
    assert checkpoint.parent == out
    assert (checkpoint / "trainer_state.json").is_file()  # the Trainer's own checkpoint, written by the Trainer
    assert Path(stopped["path"]).is_dir()  # s saves, then stops
    done_at = json.loads((Path(stopped["path"]) / "trainer_state.json").read_text())["global_step"]
    ledger = ledger_file(runs)
    assert records(ledger, "end")[-1]["reason"] == "stopped"
    assert len(records(ledger, "step")) == done_at < 100000

    # The Trainer resumes from the checkpoint c made, and trains on from its step.
    step_c = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    resumed_runs = tmp_path / "resumed"
    train(out, resumed_runs, socket_dir, "--resume", str(checkpoint), "--steps", str(step_c + 4))
    history = json.loads((out / "log_history.json").read_text())
    assert history[-1]["step"] == step_c + 4
    resumed_ledger = ledger_file(resumed_runs)
    assert [s["step"] for s in records(resumed_ledger, "step")] == list(range(step_c, step_c + 4))  # from its step
    link = records(resumed_ledger, "resumed")[0]["resumed_from"]
    assert (link["step"], link["checkpoint"]) == (step_c, str(checkpoint))
    assert Path(link["ledger"]).resolve() == ledger.resolve()  # named in the file beside trainer_state.json
    # report reads the two ledgers as one run: the first up to c's step, then the resumed one.
    assert [r["step"] for r in read_run(resumed_ledger).records if r["kind"] == "step"] == list(range(step_c + 4))


def test_a_nan_stops_the_trainer_before_its_update_naming_the_loss(tmp_path: Path, socket_dir: Path):
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "runs")]
    done = subprocess.run([*cmd, "--nan-at", "6"], env=env_for(socket_dir), capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    assert "NonFiniteError: nonfinite: first at step 6" in done.stderr
    assert "loss nan" in done.stderr  # logged at on_pre_optimizer_step, before the check
    ledger = ledger_file(tmp_path / "runs")
    last = records(ledger, "step")[-1]
    assert last["step"] == 6
    assert last["opt_skipped"] is True
    assert [(a["rule"], a["step"]) for a in records(ledger, "alert")] == [("nonfinite", 6)]
    assert records(ledger, "end")[-1]["reason"] == "nonfinite"


TRAINER_UNDER_RUN = """
import json, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
import tuiwatch.hf

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.ids = torch.randint(0, 64, (n, 4), generator=torch.Generator().manual_seed(seed)).repeat(1, 4)
        self.ids[:, 0] = torch.arange(n)  # each sequence starts with its index: the batch it came in can be told
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": self.ids[i]}

class Recording(Trainer):
    seen = []  # the sample indices of each micro-batch the Trainer trained on
    def training_step(self, model, inputs, *args, **kwargs):
        self.seen.append(inputs["input_ids"][:, 0].tolist())
        return super().training_step(model, inputs, *args, **kwargs)
    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training and len(sys.argv) > 5:  # a loss that runs the model twice on its batch
            loss = loss + 0 * super().compute_loss(model, inputs, *args, **kwargs)
        return loss

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
args = TrainingArguments(output_dir=sys.argv[1], max_steps=12, per_device_train_batch_size=8,
                         gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=6, report_to=[],
                         use_cpu=True, save_strategy="no", logging_steps=6, disable_tqdm=True)
train = Tokens(64, 0)
evaluated = train if sys.argv[3] == "train" else Tokens(32, 1)  # some evaluate on the training set itself
callbacks = [tuiwatch.hf.TuiwatchCallback(run_dir=sys.argv[4])] if len(sys.argv) > 4 else []
trainer = Recording(model=model, args=args, train_dataset=train, eval_dataset=evaluated, callbacks=callbacks)
trainer.train()
norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
json.dump({"norms": norms, "seen": Recording.seen}, open(sys.argv[2], "w"))
"""


def trainer_script(tmp_path: Path, socket_dir: Path, runner: list[str], *args: str) -> tuple[list[Record], Any]:
    """TRAINER_UNDER_RUN run by ``runner`` with ``args`` after its two paths: its steps, and what it logged."""
    script, logged = tmp_path / "trainer_script.py", tmp_path / "logged.json"
    script.write_text(TRAINER_UNDER_RUN)
    done = subprocess.run(
        [*runner, str(script), str(tmp_path / "out"), str(logged), *args],
        env=env_for(socket_dir),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return records(ledger_file(tmp_path / "runs"), "step"), json.loads(logged.read_text())


@pytest.mark.parametrize("evaluated", ["eval", "train"])
def test_an_unedited_trainer_script_under_run_records_the_batches_each_step_trained_on(
    tmp_path: Path, socket_dir: Path, evaluated: str
):
    """Two things stood between a step and its batches. Accelerate's loader draws one ahead of what it hands the
    Trainer, so each step was given the batches drawn during it (one later than those it trained on; at an epoch's
    end 1, then 3). And the Trainer draws the batches after an evaluation before it calls model.train() again:
    drawn in eval mode, they read as validation's, and that step had none and took the evaluation in. Taken for
    training's because they come from the training set, an evaluation on the training set itself went into the
    step after it (10 micro-batches) and made a 13th step of the last one: held until the next forward, they
    are told apart."""
    runner = [sys.executable, "-m", "tuiwatch", "run", "--run-dir", str(tmp_path / "runs")]
    steps, truth = trainer_script(tmp_path, socket_dir, runner, evaluated)
    assert [s["step"] for s in steps] == list(range(12))
    # Step 0's batches were drawn before the first optimizer step found the Watch; every later step has the two
    # micro-batches it trained on, the one after the evaluation (step 6) and each epoch's first (4, 8) included:
    # Accelerate draws one batch ahead of what it hands the Trainer, and the ids are those of the batches handed.
    trained_on = [a + b for a, b in zip(truth["seen"][::2], truth["seen"][1::2], strict=True)]
    assert [s["batch_ids"] for s in steps[1:]] == trained_on[1:]
    assert [s.get("micro_batches") for s in steps[1:]] == [2] * 11
    assert all(s["data_wait_s"] is not None for s in steps[1:])
    assert [s["epoch"] for s in steps[1:]] == [0] * 3 + [1] * 4 + [2] * 4
    # The Trainer's own grad norm at its logging steps (6 and 12) is the ledger's at the steps 5 and 11.
    assert [steps[5]["grad_norm"], steps[11]["grad_norm"]] == pytest.approx(truth["norms"], rel=1e-5)


@pytest.mark.parametrize("forwards", ["one", "two"])
def test_the_callback_records_the_sample_ids_each_step_trained_on(tmp_path: Path, socket_dir: Path, forwards: str):
    # The Trainer draws an accumulation window before its first forward and Accelerate draws one batch ahead:
    # each forward's ids are those of the batch it is given, found by the batch's first tensor (handed.py).
    twice = ["twice"] if forwards == "two" else []
    steps, truth = trainer_script(tmp_path, socket_dir, [sys.executable], "eval", str(tmp_path / "runs"), *twice)
    if twice:  # the second forward of a batch has no ids of its own: the step has none, never another batch's
        assert [s["batch_ids"] for s in steps] == [None] * 12
        return
    seen = truth["seen"]
    # Every step, the first, each epoch's first and the one after the evaluation included: its two micro-batches.
    assert [s["batch_ids"] for s in steps] == [a + b for a, b in zip(seen[::2], seen[1::2], strict=True)]
    assert sorted(i for s in steps[:4] for i in s["batch_ids"]) == list(range(64))  # one shuffled epoch
