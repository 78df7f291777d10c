"""Loops written the way public training scripts write them (issue 14): each in its script's style, on CPU.

- a char-LM ``get_batch`` loop with a prefetched batch (nanoGPT's shape);
- a hand-written SGD update on an LSTM with no optimizer object (word_language_model's);
- gradient accumulation counted per optimizer step;
- an eval function that switches to eval mode and back before the metrics are logged;
- a GradScaler loop whose scaled gradients overflow on purpose.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import tuiwatch.publisher.steps as steps_module
from tuiwatch.analysis.report import as_text, summarize
from tuiwatch.errors import NonFiniteError
from tuiwatch.ledger.records import Record
from tuiwatch.microscope.first_nonfinite import first_nonfinite_module
from tuiwatch.publisher.dumps import Dump, load_dump
from tuiwatch.publisher.measure import NO_BATCH, BatchInfo, batch_size, class_count
from tuiwatch.publisher.watch import Watch

from ..helpers import records, watch_steps
from .loops import train_step

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _alerts(watch: Watch) -> list[Record]:
    assert watch.ledger_path is not None
    return [r for r in records(watch.ledger_path) if r["kind"] == "alert"]


class CharModel(nn.Module):
    def __init__(self, vocab: int, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.head(self.embed(idx))
        loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def test_get_batch_loop_records_the_batch_it_is_given_and_the_fetch_as_data_wait(run_root: Path):
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    block, batch_size = 8, 4
    g = torch.Generator().manual_seed(0)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - block, (batch_size,), generator=g)
        x = torch.stack([data[i : i + block] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
        return x, y, ix

    torch.manual_seed(0)
    model = CharModel(len(chars))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fetched: list[list[int]] = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        with watch.fetching():
            X, Y, ix = get_batch()  # the prefetch before the loop, as nanoGPT does
        for _ in range(6):
            watch.step(batch=(X, Y), ids=ix)
            fetched.append(ix.tolist())
            _, loss = model(X, Y)
            watch.log(loss=loss)
            with watch.fetching():
                X, Y, ix = get_batch()  # the next batch, fetched while this step runs
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    steps = watch_steps(watch)
    assert [r["batch_ids"] for r in steps] == fetched
    assert all(r["batch_shape"] == [[batch_size, block], [batch_size, block]] for r in steps)
    assert all(r["tokens"] == batch_size * block for r in steps)
    # Each step's wait is its batch's fetch: measured (not 0 by default), and never counted as compute.
    assert all(r["data_wait_s"] is not None and r["data_wait_s"] > 0 for r in steps)
    assert all(r["compute_s"] is not None and r["compute_s"] > 0 for r in steps)
    assert all(r["examples_per_s"] is not None for r in steps)


EVAL_S = 0.2  # an evaluation that takes this long (nanoGPT's is 200 batches a split)


def _slow_evaluation(watch: Watch, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """An evaluation in a validation block that takes EVAL_S."""
    model.eval()
    with watch.validation(), torch.no_grad():
        _, loss = model(x, y)
        time.sleep(EVAL_S)  # the evaluation's work, not a synchronisation
        watch.log(val_loss=loss)
    model.train()


def test_an_evaluation_inside_a_step_is_not_its_compute_before_or_after_its_work(run_root: Path):
    """nanoGPT evaluates at the top of its loop, after the boundary and before the step's forward; a DataLoader
    loop evaluates every N steps after the optimizer stepped, before the next batch ends the step. Either way
    the step used to count the evaluation as its compute (and, at the top, as its forward)."""
    torch.manual_seed(0)
    model = CharModel(5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 4))
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for i in range(6):
            watch.step(batch=(x, y))
            if i == 2:
                _slow_evaluation(watch, model, x, y)  # at the top: nanoGPT's place
            _, loss = model(x, y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if i == 4:
                _slow_evaluation(watch, model, x, y)  # after the update, before the next boundary
    steps = watch_steps(watch)
    assert [r["step"] for r in steps] == list(range(6))
    assert watch.ledger_path is not None
    # Each at the last step that trained: at the top of step 2 the weights are step 1's.
    assert [r["step"] for r in records(watch.ledger_path) if r["kind"] == "eval"] == [1, 4]
    for r in (steps[2], steps[4]):
        assert 0 < r["compute_s"] < EVAL_S, r
        assert 0 < r["forward_s"] < EVAL_S, r  # the phases stay the step's own
        assert r["backward_s"] is not None
        assert r["optimizer_s"] is not None


def test_a_loop_that_measures_no_wait_says_not_measured(run_root: Path):
    torch.manual_seed(0)
    model = CharModel(5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            watch.step()
            _, loss = model(torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 4)))
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
    steps = watch_steps(watch)
    assert [r["data_wait_s"] for r in steps] == [None, None, None]
    assert watch.ledger_path is not None
    text = as_text(summarize(records(watch.ledger_path)))
    assert "data wait  not measured (no watch.batches() or watch.fetching() in the loop)" in text


@pytest.mark.parametrize("kept", [False, True])
def test_a_batch_drawn_before_a_break_out_of_the_epoch_is_no_step(run_root: Path, kept: bool):
    """Optuna's PyTorch examples limit each epoch's batches by breaking out after drawing one more
    (``if batch_idx * BATCHSIZE >= N_TRAIN_EXAMPLES: break``): that batch was a step with no loss or update
    every epoch. A break after a batch's step (pytorch/examples' ``--dry-run``) keeps it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # ten batches, in order: ids 0-3, 4-7, ...
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            for batch_idx, (x, y) in enumerate(watch.batches(loader)):
                if batch_idx >= 4:
                    break
                loss = nn.functional.cross_entropy(model(x), y)
                watch.log(loss=loss)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if kept and batch_idx == 1:
                    break  # after its step: a dry run's
    steps = watch_steps(watch)
    per_epoch = 2 if kept else 4
    assert [r["step"] for r in steps] == list(range(3 * per_epoch))
    assert [r["opt_step"] for r in steps] == list(range(1, 3 * per_epoch + 1))
    assert all(r["loss"] is not None for r in steps)
    assert [r["epoch"] for r in steps] == [e for e in range(3) for _ in range(per_epoch)]
    assert [r["batch_ids"][0] for r in steps[: per_epoch + 1]] == [*range(0, 4 * per_epoch, 4), 0]
    assert watch.ledger_path is not None
    end = records(watch.ledger_path, "end")[0]
    assert (end["steps"], end["opt_steps"]) == (3 * per_epoch, 3 * per_epoch)


@pytest.mark.parametrize("reason", ["exception", "finished"])
@pytest.mark.parametrize("where", ["before the forward", "in the forward"])
def test_a_step_left_by_an_exception_is_the_step_the_run_failed_in(run_root: Path, where: str, reason: str):
    """An exception raised in a step before the model's forward returned leaves the loader just as a break does;
    that step is kept, its batch with it: the one to look at."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(KeyError):
        for batch_idx, (x, y) in enumerate(watch.batches(loader)):
            if batch_idx == 3:
                if where == "before the forward":
                    raise KeyError("a bad sample")  # the loop's own code, say its preprocessing
                model.register_forward_pre_hook(_bad_sample)
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    # As the context manager or the exit hook close it; a loop that catches the exception and calls close() itself
    # keeps the step when the model's forward raised (an OOM: its alert names that step), not when its own code did.
    kept = where == "in the forward" or reason == "exception"
    watch.close(reason)
    steps = watch_steps(watch)
    assert [r["step"] for r in steps] == [0, 1, 2, 3][: 4 if kept else 3]
    if kept:
        assert steps[3]["batch_ids"] == [12, 13, 14, 15]
        assert steps[3].get("loss") is None
    assert watch.ledger_path is not None
    ends = [(e["reason"], e["steps"]) for e in records(watch.ledger_path, "end")]
    assert ends == [(reason, 4 if kept else 3)]


def _bad_sample(module: nn.Module, args: object) -> None:
    raise KeyError("a bad sample")  # raised inside the model's call


class WordLSTM(nn.Module):
    def __init__(self, vocab: int = 12, dim: int = 8):
        super().__init__()
        self.encoder = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim)
        self.decoder = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden


def test_hand_written_sgd_reports_lr_and_epoch_and_gets_norms_from_the_model(run_root: Path):
    torch.manual_seed(0)
    model = WordLSTM()
    corpus = torch.randint(0, 12, (61, 2))  # (tokens, batch): word_language_model's batchify layout
    bptt, clip = 6, 0.25
    lr = 20.0
    epochs: list[int] = []
    norms: list[float] = []  # what torch's clip_grad_norm_ returned: the norm before it clipped
    with Watch(model, run_dir=run_root, system=False, quiet=True, update_norm_every=2) as watch:
        for epoch in range(1, 3):
            hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
            for i in range(0, corpus.size(0) - 1, bptt):
                watch.step()
                n = min(bptt, len(corpus) - 1 - i)
                data, targets = corpus[i : i + n], corpus[i + 1 : i + 1 + n]
                model.zero_grad()
                hidden = (hidden[0].detach(), hidden[1].detach())
                output, hidden = model(data, hidden)
                loss = nn.functional.cross_entropy(output.view(-1, 12), targets.reshape(-1))
                loss.backward()
                norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)  # type: ignore[arg-type]
                watch.log(loss=loss, lr=lr, epoch=epoch)
                epochs.append(epoch)
            lr /= 4.0
    steps = watch_steps(watch)
    assert [r["epoch"] for r in steps] == epochs
    assert [r["lr"] for r in steps] == [[20.0]] * 10 + [[5.0]] * 10
    assert [r["opt_step"] for r in steps] == list(range(1, 21))
    # The loop's own torch.nn.utils.clip_grad_norm_: its pre-clip norm, not the norm after it clipped.
    assert [r["grad_norm"] for r in steps] == norms
    assert [r["grad_norm_clipped"] for r in steps] == [n > clip for n in norms]
    assert any(n > clip for n in norms)
    with_param = [r for r in steps if r["param_norm"] is not None]  # every 10th optimizer step, from the first
    assert [r["opt_step"] for r in with_param] == [1, 11]
    assert all(r["param_norm"] > 0 for r in with_param)
    sampled = [r["update_norm"] for r in steps if r["update_norm"] is not None]
    assert len(sampled) == 10  # every 2nd update
    assert all(u > 0 for u in sampled)  # and the weights moved
    assert not [a for a in _alerts(watch) if a["severity"] != "info"]


def test_accumulation_counted_per_optimizer_step_folds_the_micro_batches(run_root: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(64, 3, generator=g), torch.randint(0, 2, (64,), generator=g))
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True, generator=g)
    accum = 4
    seen: list[int] = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, step_per="optimizer") as watch:
        for i, (x, y) in enumerate(watch.batches(loader)):
            seen.append(len(x))
            loss = nn.functional.cross_entropy(model(x), y) / accum
            watch.log(loss=loss)
            loss.backward()
            if (i + 1) % accum == 0:
                watch.clip_grad_norm_(1.0)
                optimizer.step()
                optimizer.zero_grad()
    assert watch.ledger_path is not None
    run = records(watch.ledger_path)[0]
    assert run["step_per"] == "optimizer"
    steps = watch_steps(watch)
    assert len(steps) == 32 // accum
    assert [r["opt_step"] for r in steps] == list(range(1, 9))
    assert all(r["micro_batches"] == accum for r in steps)
    assert all(r["lr"] == [0.05] and r["grad_norm"] is not None for r in steps)
    ids = [i for r in steps for i in r["batch_ids"]]
    assert sorted(ids) == list(range(64))  # every sample of the epoch, once, in the steps that trained on it
    assert all(len(r["batch_ids"]) == accum * 2 for r in steps)
    assert all(r["examples_per_s"] is not None and r["data_wait_s"] > 0 for r in steps)
    assert all(r["batch_shape"] == [[2, 3], [2]] for r in steps)  # each micro-batch's shape


def test_a_step_that_folds_without_end_keeps_its_ids_bounded_and_each_kept_batch_its_own(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
):
    # A Fisher-information pass backpropagates every batch of a dataset and never steps: counted per optimizer
    # step, the batches fold into one step. Its ids were a new list at every fold (quadratic: 10k batches of 64
    # ids copied 3.2e9 ids); they are now extended in place, up to MAX_STEP_IDS, after which the step has none.
    monkeypatch.setattr(steps_module, "MAX_STEP_IDS", 10)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, step_per="optimizer") as watch:
        for i in range(3):
            x = torch.randn(2, 3)
            watch.step(batch=(x,), ids=[2 * i, 2 * i + 1])
            model(x).sum().backward()
        tracker = watch._tracker
        s = tracker.cur
        assert s is not None
        assert s.batch_ids == [0, 1, 2, 3, 4, 5]
        # Each batch kept for a dump has its own ids still, the first one's list not grown by the folds.
        assert [k.ids for k in tracker.recent._kept] == [[0, 1], [2, 3], [4, 5]]
        for i in range(3, 6):
            watch.step(batch=(torch.randn(2, 3),), ids=[2 * i, 2 * i + 1])
        assert s.batch_ids is None  # 12 ids > 10
        assert s.micro_batches == 6
        optimizer.step()
    (step,) = watch_steps(watch)
    assert step["batch_ids"] is None
    assert step["micro_batches"] == 6


def test_accumulation_by_step_calls_folds_too(run_root: Path):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, step_per="optimizer") as watch:
        for i in range(12):
            x = torch.randn(2, 3)
            watch.step(batch=(x,), ids=[2 * i, 2 * i + 1])
            model(x).sum().backward()
            if (i + 1) % 3 == 0:
                optimizer.step()
                optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [r["micro_batches"] for r in steps] == [3, 3, 3, 3]
    assert steps[1]["batch_ids"] == [6, 7, 8, 9, 10, 11]


class DictOutputClassifier(nn.Module):
    """A Hugging Face-style model: the loss is computed inside, the output is a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(features)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_loss_chance_finds_the_classes_of_a_dict_output_and_names_shuffled_labels(run_root: Path):
    torch.manual_seed(0)
    model = DictOutputClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(320):
            batch = {"features": torch.randn(16, 6, generator=g), "labels": torch.randint(0, 4, (16,), generator=g)}
            watch.step(batch=batch)
            out = model(**batch)  # labels unrelated to the features: the best it can do is chance
            watch.log(loss=out["loss"])
            out["loss"].backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert steps[0]["classes"] == 4
    assert steps[0]["batch_shape"] == {"features": [16, 6], "labels": [16]}
    fired = [a for a in _alerts(watch) if a["rule"] == "loss-chance" and a["severity"] == "warning"]
    assert fired
    assert fired[0]["evidence"]["classes"] == 4
    assert "logits" in fired[0]["evidence"]["classes_from"]


def _loss_first_model(style: str) -> tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """A model that computes its loss inside and returns it first, and how a loop gets that loss from it."""
    if style == "dict":
        model = DictOutputClassifier()
        return model, lambda x, y: model(x.float()[:, :6], y[:, 0])["loss"]
    if style == "dataclass":
        scored = ScoredClassifier()
        return scored, lambda x, y: scored(x.float()[:, :6], y[:, 0]).loss
    transformers = pytest.importorskip("transformers", reason="transformers is in the dev dependencies")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    gpt2 = transformers.GPT2LMHeadModel(config)
    if style == "GPT-2, return_dict=False":
        return gpt2, lambda x, y: gpt2(input_ids=x, labels=y, return_dict=False)[0]
    return gpt2, lambda x, y: gpt2(input_ids=x, labels=y).loss


@dataclass
class Scored:
    loss: torch.Tensor
    scores: torch.Tensor


class ScoredClassifier(DictOutputClassifier):
    """The same model, its output a dataclass of one's own with no field named logits."""

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> Scored:  # type: ignore[override]
        out = super().forward(features, labels)
        return Scored(out["loss"], out["logits"])


@pytest.mark.parametrize("style", ["GPT-2", "GPT-2, return_dict=False", "dict", "dataclass"])
def test_a_nan_loss_over_finite_logits_is_named_the_losss_not_the_models(run_root: Path, style: str):
    # A batch whose every label is masked (-100: a prompt-only or all-padding batch) makes the model's own loss
    # 0/0 = NaN while its logits are finite. The model returns that loss first; its probe took it for the
    # model's output and the alert said boundary=forward, sending the user to the model instead of the labels.
    torch.manual_seed(0)
    model, loss_of = _loss_first_model(style)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    # The gradients stay finite (zero: no label counts), so the default "stop" lets the run go on; the alert is
    # critical all the same.
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for i in range(6):
            x = torch.randint(0, 4, (4, 16), generator=g)
            y = torch.full_like(x, -100) if i == 4 else x
            watch.step(batch={"input_ids": x, "labels": y})
            loss = loss_of(x, y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4, 5]
    assert steps[3]["finite"] == {"batch": True, "forward": True, "loss": True, "grad": True, "param": None}
    assert steps[4]["finite"]["forward"] is True
    assert steps[4]["finite"]["loss"] is False
    assert math.isnan(steps[4]["loss"])
    fired = [(a["rule"], a["step"], a["severity"]) for a in _alerts(watch) if a["severity"] != "info"]
    assert fired == [("nonfinite", 4, "critical")]
    alert = _alerts(watch)[0]
    assert alert["evidence"]["boundary"] == "loss"
    assert "boundary=loss" in alert["message"]


class Policy(nn.Module):
    """CleanRL's (and Lightning Fabric's PPO example's) agent shape: the sampled actions first, then floats."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Linear(4, 2)
        self.poisoned = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.actor(x) * (math.nan if self.poisoned else 1.0)
        log_probs = torch.log_softmax(logits, -1)
        actions = torch.distributions.Categorical(logits=logits.nan_to_num()).sample()
        return actions, log_probs.gather(1, actions[:, None]).squeeze(1), log_probs


def test_a_policys_output_is_checked_past_its_integer_actions(run_root: Path):
    # (action, logprob, ...): the probe took the first tensor with a dimension, the sampled actions, integers with
    # nothing to check: finite.forward was null at every step and a NaN policy was named the loss's.
    torch.manual_seed(0)
    model = Policy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, on_nonfinite="skip") as watch:
        for i in range(4):
            watch.step()
            model.poisoned = i == 2
            _, logprob, _ = model(torch.randn(8, 4))
            loss = -logprob.mean()
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert [s["finite"]["forward"] for s in watch_steps(watch)] == [True, True, False, True]
    alert = next(a for a in _alerts(watch) if a["rule"] == "nonfinite")
    assert (alert["step"], alert["evidence"]["boundary"]) == (2, "forward")


class LogOfLinear(nn.Module):
    """A model whose own log() of a negative activation makes its output NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.log(self.a(x)))
        return out


def test_a_nan_from_a_forward_called_past_the_hook_says_the_output_was_not_checked(run_root: Path):
    # model.forward(x) in place of model(x) skips the Watch's forward hook, so the output is not checked. The
    # model's NaN stopped the run with boundary=loss and the advice "finite outputs gave a non-finite loss".
    torch.manual_seed(0)
    model = LogOfLinear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(NonFiniteError) as raised, watch:
        for x, y in watch.batches([(torch.randn(16, 4), torch.randint(0, 2, (16,)))] * 3):
            loss = nn.functional.cross_entropy(model.forward(x), y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
    assert "boundary=loss (loss nan, grad norm nan; not checked before it: forward)" in str(raised.value)
    (step,) = watch_steps(watch)
    assert step["finite"] == {"batch": True, "forward": None, "loss": False, "grad": False, "param": None}
    (alert,) = [a for a in _alerts(watch) if a["rule"] == "nonfinite"]
    assert alert["evidence"]["unchecked"] == ["forward"]
    assert "model.forward(x) in place of model(x)" in alert["next_check"]


class LossOnly(nn.Module):
    """A model that computes its loss inside and returns it alone, as MMEngine's ``BaseModel`` does in its
    ``mode="loss"``: the output holds no tensor of the model's to check."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor, mode: str = "loss") -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.b(torch.log(self.a(x))), y)}


def test_a_nan_in_a_model_that_returns_its_loss_alone_names_both_links(run_root: Path):
    # MMEngine's models return {"loss": ...} in training: a NaN the model made stopped the run with boundary=loss,
    # and the advice said the forward ran past the Watch's hook, which it had not.
    torch.manual_seed(0)
    model = LossOnly()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    batch = (torch.randn(16, 4), torch.randint(0, 2, (16,)))
    with pytest.raises(NonFiniteError), watch:
        for x, y in watch.batches([batch] * 3):
            loss = model(x, y, mode="loss")["loss"]
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
    (step,) = watch_steps(watch)
    assert step["finite"] == {"batch": True, "forward": None, "loss": False, "grad": False, "param": None}
    (alert,) = [a for a in _alerts(watch) if a["rule"] == "nonfinite"]
    assert alert["evidence"]["unchecked"] == ["forward"]
    assert alert["next_check"].startswith("the loss, or the model:")
    assert "returned its loss alone" in alert["next_check"]
    # What the advice offers: the dump's batch, replayed, names the layer (the log between a and b is no module:
    # b's output is the first that holds a NaN).
    dump = load_dump(alert["evidence"]["dump"])
    assert isinstance(dump, Dump)
    site = first_nonfinite_module(model, dump.batch, lambda m, b: m(*b, mode="loss"))
    assert (site.module, site.batch_finite, site.output_finite) == ("b", True, False)


class NamedLosses(nn.Module):
    """A model that returns its loss in parts by name, as MMEngine's detectors do (``loss_cls``, ``loss_bbox``):
    the classification loss averages over the labelled rows, which a batch may not have."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.cls, self.reg = nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.body(x))
        labelled = y >= 0
        per_row = nn.functional.cross_entropy(self.cls(h), y.clamp(min=0), reduction="none")
        return {
            "loss_cls": (per_row * labelled).sum() / labelled.sum(),  # 0/0 for a batch with no label
            "loss_reg": self.reg(h).pow(2).mean(),
        }


def test_a_nan_in_a_loss_returned_in_parts_by_name_is_not_called_the_models(run_root: Path):
    # The first float tensor not keyed "loss" was taken for the model's output: loss_cls, a NaN of the loss (no
    # labelled row: 0/0), was named boundary=forward with "a finite batch gave a non-finite output".
    torch.manual_seed(0)
    model = NamedLosses()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    batches = [(x, torch.randint(0, 2, (8,))), (x, torch.full((8,), -1))]
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(NonFiniteError, match="boundary=loss"), watch:
        for x, y in watch.batches(batches):
            loss = sum(model(x, y).values())
            assert isinstance(loss, torch.Tensor)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["finite"]["forward"] for s in steps] == [None, None]
    assert steps[1]["finite"]["loss"] is False
    (alert,) = [a for a in _alerts(watch) if a["rule"] == "nonfinite"]
    assert (alert["step"], alert["evidence"]["boundary"], alert["evidence"]["unchecked"]) == (1, "loss", ["forward"])


@dataclass
class Pairs:
    """A batch class of one's own, as research code writes them: ``batch.x``, ``batch.y``."""

    x: torch.Tensor
    y: torch.Tensor


class Graph:
    """A batch object of a kind the Watch does not walk (a DGL graph, say: PyG's are walked, test_graph_batches.py)."""

    def __init__(self, x: torch.Tensor):
        self.x = x


def test_a_dataclass_batch_is_recorded_and_a_nan_in_it_is_named_the_datas(run_root: Path):
    # A dataclass batch was a leaf the Watch did not look into: no shapes, no probe, and `finite.batch` said true
    # without having looked, so a NaN in the data was named boundary=forward (the model) and its dump kept the
    # batch as text.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    x[37, 2] = math.nan  # sample 37: the fifth batch of 8, in order
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())

    def collate(rows: list[tuple[torch.Tensor, torch.Tensor]]) -> Pairs:
        return Pairs(torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(NonFiniteError, match="boundary=batch"), watch:
        for batch in watch.batches(torch.utils.data.DataLoader(data, batch_size=8, collate_fn=collate)):
            loss = nn.functional.cross_entropy(model(batch.x), batch.y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    assert steps[0]["batch_shape"] == {"x": [8, 4], "y": [8]}
    assert steps[3]["finite"]["batch"] is True
    assert steps[4]["finite"]["batch"] is False
    alert = _alerts(watch)[0]
    assert (alert["rule"], alert["step"], alert["evidence"]["boundary"]) == ("nonfinite", 4, "batch")
    assert alert["evidence"]["nonfinite_sample_ids"] == [37]
    dumped = load_dump(alert["evidence"]["dump"])
    assert isinstance(dumped, Dump)
    assert set(dumped.batch) == {"x", "y"}  # its fields, as a dict: the tensors, not the dataclass's text
    assert torch.isnan(dumped.batch["x"][5, 2])


def test_a_mapping_batch_that_is_no_dict_is_dumped_as_its_tensors(run_root: Path):
    # Hugging Face's collators return a BatchEncoding (a UserDict, not a dict), as a TensorDict is a Mapping and no
    # dict: the dump of such a batch held its text, which no replay can use.
    from transformers import BatchEncoding

    data = torch.randn(40, 4)
    data[37, 2] = math.nan

    def collate(rows: list[tuple[torch.Tensor, torch.Tensor]]) -> BatchEncoding:
        return BatchEncoding({"x": torch.stack([r[0] for r in rows]), "y": torch.stack([r[1] for r in rows])})

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    rows = torch.utils.data.TensorDataset(data, torch.randint(0, 2, (40,)))
    with pytest.raises(NonFiniteError, match="boundary=batch"), watch:
        for batch in watch.batches(torch.utils.data.DataLoader(rows, batch_size=8, collate_fn=collate)):
            loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    alert = _alerts(watch)[0]
    assert (alert["step"], alert["evidence"]["nonfinite_sample_ids"]) == (4, [37])
    dumped = load_dump(alert["evidence"]["dump"])
    assert isinstance(dumped, Dump)
    assert type(dumped.batch) is dict
    assert set(dumped.batch) == {"x", "y"}
    assert torch.isnan(dumped.batch["x"][5, 2])
    assert torch.equal(dumped.batch["x"][0], data[32])


def test_a_batch_object_whose_tensors_are_not_found_is_not_called_finite(run_root: Path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(2):
            batch = Graph(torch.randn(8, 4))
            watch.step(batch=batch)
            loss = model(batch.x).sum()
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["batch_shape"] for s in steps] == [None, None]
    assert [s["finite"]["batch"] for s in steps] == [None, None]  # not looked at: not measured, not "finite"
    assert [s["finite"]["forward"] for s in steps] == [True, True]


class Offsets:
    """Per-sample offsets in an object of the loop's own, which the Watch does not look into (a DGL graph's features
    beside its labels, say)."""

    def __init__(self, values: torch.Tensor):
        self.values = values


def _collated(rows: list[tuple[torch.Tensor, torch.Tensor]], kind: str) -> tuple[torch.Tensor, Any, Any]:
    """(features, per-sample offsets, sample indices as a numpy int array): the offsets as a numpy float array, or
    in an object of one's own."""
    x = torch.stack([r[0] for r in rows])
    offsets = torch.stack([r[1] for r in rows])
    return x, offsets.numpy() if kind == "numpy" else Offsets(offsets), numpy.arange(len(rows))


@pytest.mark.parametrize("kind", ["object", "numpy"])
def test_a_nan_in_a_batch_part_beside_its_tensors_is_the_datas_or_the_batch_is_not_called_finite(
    run_root: Path, kind: str
):
    # The tensors alone were summed, and a finite sum was the batch's: a NaN in a part beside them reached the
    # output, and the alert named the model as the first broken link, with the advice to look at its layers. A
    # numpy array of floats (a collate's output left as numpy) is now summed by numpy: its NaN is the data's. An
    # object the Watch does not look into leaves the batch's finiteness unknown: "the model, or the data".
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    offsets = torch.zeros(32)
    offsets[21] = math.nan  # sample 21: the third batch of 8
    data = torch.utils.data.TensorDataset(x, offsets)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    boundary = "batch" if kind == "numpy" else "forward"
    with pytest.raises(NonFiniteError, match=f"boundary={boundary}"), watch:
        loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=lambda rows: _collated(rows, kind))
        for xb, shift, _ids in watch.batches(loader):
            values = torch.from_numpy(shift) if kind == "numpy" else shift.values
            loss = model(xb + values[:, None]).square().mean()
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["batch_shape"] for s in steps] == [[[8, 4], None, None]] * 3
    if kind == "numpy":
        assert [s["finite"]["batch"] for s in steps] == [True, True, False]
    else:
        assert [s["finite"]["batch"] for s in steps] == [None, None, None]  # a part not read: not known
    alert = _alerts(watch)[0]
    assert (alert["step"], alert["evidence"]["boundary"]) == (2, boundary)
    dumped = load_dump(alert["evidence"]["dump"])
    assert isinstance(dumped, Dump)
    if kind == "object":
        assert alert["next_check"].startswith("the model, or the data")  # the batch not claimed finite
    else:
        assert alert["evidence"]["nonfinite_sample_ids"] == [21]
        # The dump holds the arrays' numbers (as tensors: weights_only loads no numpy), not their text.
        assert torch.isnan(dumped.batch[1][5]).item()
        assert torch.equal(dumped.batch[2], torch.arange(8))


def test_a_batch_whose_unread_parts_cannot_hold_a_nan_is_still_called_finite_and_a_nan_in_its_tensors_named(
    run_root: Path,
):
    # Text, numbers and integer arrays beside the tensors (file names, sizes, ids) cannot be NaN: the tensors' sum
    # is the batch's, as before.
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    with pytest.raises(NonFiniteError, match="boundary=batch"), watch:
        for step in range(3):
            x = torch.randn(8, 4)
            if step == 2:
                x[3, 1] = math.nan
            batch = {"x": x, "file": [f"{i}.png" for i in range(8)], "ids": numpy.arange(8), "scale": numpy.float32(2)}
            watch.step(batch=batch)
            loss = model(batch["x"]).square().mean()
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [s["finite"]["batch"] for s in steps] == [True, True, False]
    assert _alerts(watch)[0]["evidence"]["boundary"] == "batch"


class Imputing(nn.Module):
    """Missing values encoded as NaN in the inputs, imputed inside the forward (zeros and a mask channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        missing = torch.isnan(x)
        out: torch.Tensor = self.net(torch.cat([torch.nan_to_num(x), missing.float()], dim=1))
        return out


def test_missing_values_as_nan_that_the_model_imputes_are_one_info_not_a_critical_alert(run_root: Path):
    # A healthy run whose data holds NaN by design: the batch is non-finite at nearly every step, the output and
    # the loss never are. It raised a critical nonfinite alert at step 0, active for the whole run, with a dump.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(640, 4, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    x[torch.rand(640, 4, generator=g) < 0.1] = math.nan  # 10 % missing
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, generator=g)
    torch.manual_seed(0)
    model = Imputing()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(3):
            for xb, yb in watch.batches(loader):
                loss = nn.functional.cross_entropy(model(xb), yb)
                watch.log(loss=loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    steps = watch_steps(watch)
    assert len(steps) == 60
    assert sum(s["finite"]["batch"] is False for s in steps) > 50
    assert all(s["finite"]["forward"] and s["finite"]["loss"] for s in steps)
    assert [(a["rule"], a["step"], a["severity"]) for a in _alerts(watch)] == [("nonfinite", 0, "info")]
    assert not (watch.ledger_path.parent / "dumps").exists()  # type: ignore[union-attr]
    assert steps[-1]["loss"] < steps[0]["loss"]
    # report counted every such step as non-finite: "nonfinite  57 steps" for a run with nothing wrong
    handled = sum(s["finite"]["batch"] is False for s in steps)
    text = as_text(summarize(records(watch.ledger_path)))  # type: ignore[arg-type]
    assert f"nonfinite  0 steps; {handled} more with a non-finite batch the model handled" in text.splitlines()


def test_a_two_output_regression_near_ln_2_is_not_a_classifier_at_chance(run_root: Path):
    # A healthy regression whose targets hold noise of variance 0.7 no model can predict: its MSE settles near
    # ln 2 = 0.693. Its (batch, 2) output alone looked like two classes, and loss-chance said "labels shuffled?".
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.randn(20000, 8, generator=g)
    y = x @ (0.3 * torch.randn(8, 2, generator=g)) + 0.7**0.5 * torch.randn(20000, 2, generator=g)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256, shuffle=True)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, rules={"data-bound": False}) as watch:
        for _ in range(4):
            for xb, yb in watch.batches(loader):
                loss = nn.functional.mse_loss(model(xb), yb)
                watch.log(loss=loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    steps = watch_steps(watch)
    assert len(steps) == 316
    late = sorted(s["loss"] for s in steps[-100:])
    assert abs(late[50] - math.log(2)) < 0.1 * math.log(2)  # where the old class count put "chance"
    assert [(a["rule"], a["step"]) for a in _alerts(watch)] == []
    assert all("classes" not in s for s in steps)


def _long(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.long)


@pytest.mark.parametrize(
    ("output", "batch", "classes"),
    [
        (torch.zeros(8, 3), (torch.zeros(8, 5), _long(8)), 3),  # (inputs, labels)
        (torch.zeros(8, 3), (torch.zeros(8, 5), _long(8, 1)), 3),  # labels squeezed in the loss
        (torch.zeros(8, 2), (torch.zeros(8, 2), _long(8)), 2),  # inputs as wide as the output
        ({"logits": torch.zeros(4, 16, 64)}, {"input_ids": _long(4, 16), "labels": _long(4, 16)}, 64),
        ((torch.zeros(4, 16, 64), None), (_long(4, 16), _long(4, 16)), None),  # unnamed 3-D: says nothing
        (torch.zeros(8, 2), (torch.zeros(8, 5), torch.zeros(8, 2)), None),  # regression targets
        (torch.zeros(8, 3), (torch.zeros(8, 5), torch.zeros(8, 3).bool()), None),  # multi-hot labels (BCE)
        (torch.zeros(8, 3), {"x": torch.zeros(8, 5), "soft": torch.zeros(8, 3)}, None),  # soft labels
        (torch.zeros(8, 2), NO_BATCH, 2),  # the batch not seen: the width is all there is
        (torch.zeros(8, 1), (torch.zeros(8, 5), _long(8)), None),
        (torch.zeros(8, 3, 4, 4), (torch.zeros(8, 5), _long(8, 4, 4)), None),  # a map
    ],
)
def test_the_class_count_needs_integer_labels_of_one_per_output_row_where_the_batch_is_seen(
    output: object, batch: object, classes: int | None
):
    assert class_count(output, batch) == classes


class Shards(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Three shards, one per loader worker; shard 0 sits on slow storage."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        shard = info.id if info is not None else 0
        g = torch.Generator().manual_seed(shard)
        for _ in range(40):
            if shard == 0:
                time.sleep(0.1)
            yield torch.randn(8, 6, generator=g), torch.randint(0, 4, (8,), generator=g)


@pytest.mark.integration  # three loader worker processes
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 2 cores: as the user had
def test_one_slow_shard_among_workers_is_named_by_data_bound(run_root: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(Shards(), batch_size=None, num_workers=3)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            # A 5 ms step, as a real model's: the fast shards' batches arrive within it even when other jobs
            # delay the workers by a few ms, so only the slow shard's batches wait (a sleep: it holds no core).
            time.sleep(0.005)
    fired = [a for a in _alerts(watch) if a["rule"] == "data-bound" and a["severity"] == "warning"]
    assert fired, [(a["rule"], a["step"]) for a in _alerts(watch)]
    assert fired[0]["evidence"]["data_wait_share"] > 0.5
    # Idle: every 3rd batch (the slow shard's worker). Beside other jobs on 2 cores all three workers lag,
    # and the loader as a whole is then too slow; the periodic case itself is pinned in tests/rules.
    assert fired[0]["evidence"]["pattern"] in (
        "every 3rd batch waits: one slow worker or shard",
        "most batches wait: the loader as a whole is too slow",
    )


def _estimate_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """nanoGPT's estimate_loss: eval mode for the forwards, train mode restored before returning."""
    model.eval()
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(x), y)
    model.train()
    return loss


@pytest.mark.parametrize("evaluated", ["inside the block", "before it"])
def test_validation_is_judged_by_the_mode_of_the_evaluations_forwards_not_of_the_log(run_root: Path, evaluated: str):
    """nanoGPT's estimate_loss inside the block, or the README's loop: an evaluation function (Lightning's Fabric
    language-model example) returns its numbers and the block only logs them. Both restore model.train() before
    returning. Judged by the mode at the log, every such block raised eval-mode on a healthy run."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.1), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))

    def evaluate(step: int) -> torch.Tensor:
        if step < 5:
            return _estimate_loss(model, x, y)
        with torch.no_grad():  # the bug eval-mode exists for: the evaluation's forwards in train mode
            return nn.functional.cross_entropy(model(x), y)

    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for step in range(6):
            watch.step()
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 2 == 1 and evaluated == "inside the block":
                with watch.validation():
                    watch.log(val_loss=evaluate(step))  # model.training is True again here
            elif step % 2 == 1:
                val = evaluate(step)
                with watch.validation():
                    watch.log(val_loss=val)
    assert watch.ledger_path is not None
    evals = [r for r in records(watch.ledger_path) if r["kind"] == "eval"]
    assert [(r["step"], r["training"]) for r in evals] == [(1, False), (3, False), (5, True)]
    fired = [a for a in _alerts(watch) if a["rule"] == "eval-mode" and a["severity"] != "info"]
    assert [a["step"] for a in fired] == [5]


@pytest.mark.parametrize("copy", ["swa", "ema"])
def test_a_validation_of_an_averaged_copy_makes_no_claim_about_the_mode(run_root: Path, copy: str):
    """torch's SWA recipe (torch.optim.swa_utils) evaluates the AveragedModel in eval mode, and EMA loops their EMA
    copy: the watched model runs no forward in the block, and its last one was a training step's. Judged by the
    watched model's mode (training), every such block raised eval-mode on a healthy run."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    averaged = (
        torch.optim.swa_utils.AveragedModel(model)
        if copy == "swa"
        else torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    )
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for step in range(6):
            train_step(watch, model, optimizer, (x, y))
            averaged.update_parameters(model)
            if step % 2 == 1:
                with watch.validation():
                    averaged.eval()
                    with torch.no_grad():
                        watch.log(val_loss=nn.functional.cross_entropy(averaged(x), y))
                    averaged.train()
        # The watched model itself evaluated in training mode after its last update: still told.
        with torch.no_grad():
            val = nn.functional.cross_entropy(model(x), y)
        with watch.validation():
            watch.log(val_loss=val)
    assert watch.ledger_path is not None
    evals = [r for r in records(watch.ledger_path) if r["kind"] == "eval"]
    assert [(r["step"], r["training"]) for r in evals] == [(1, None), (3, None), (5, None), (5, True)]
    fired = [a for a in _alerts(watch) if a["rule"] == "eval-mode" and a["severity"] != "info"]
    assert [a["step"] for a in fired] == [5]
    assert len(fired) == 1


def test_gradscaler_skips_are_info_with_the_scale_change_and_no_dump(run_root: Path):
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    overflow = {2, 5}
    with Watch(model, optimizer, scaler=scaler, run_dir=run_root, system=False, quiet=True) as watch:
        for i in range(8):
            watch.step()
            loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,)))
            if i in overflow:
                loss = loss * 1e36  # finite, but not once scaled: what an fp16 overflow looks like
            watch.log(loss=loss)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            watch.clip_grad_norm_(1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    steps = watch_steps(watch)
    assert [r["step"] for r in steps if r["opt_step"] is None] == sorted(overflow)
    assert [r["scale"] for r in steps] == [65536.0] * 2 + [32768.0] * 3 + [16384.0] * 3
    alerts = _alerts(watch)
    assert [(a["rule"], a["severity"], a["step"]) for a in alerts] == [("nonfinite", "info", s) for s in (2, 5)]
    assert "scale 65536 -> 32768" in alerts[0]["message"]
    assert alerts[0]["evidence"]["scaler_skip"] is True
    assert watch.run_dir is not None
    assert not (watch.run_dir / "dumps").exists()


def test_under_a_scaler_a_nonfinite_loss_stays_critical(run_root: Path):
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with Watch(model, optimizer, scaler=scaler, run_dir=run_root, system=False, quiet=True) as watch:
        for i in range(3):
            watch.step()
            loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,)))
            if i == 1:
                loss = loss * math.inf
            watch.log(loss=loss)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    fired = [(a["rule"], a["severity"], a["step"]) for a in _alerts(watch) if a["severity"] != "info"]
    assert fired == [("nonfinite", "critical", 1)]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class NumpyBatchSampler(torch.utils.data.Sampler[list]):  # type: ignore[type-arg]
    """A custom batch sampler as many scripts write one: slices of np.random.permutation, so numpy ints."""

    def __init__(self, n: int, batch: int, seed: int):
        self.n, self.batch, self.rng = n, batch, __import__("numpy").random.default_rng(seed)
        self.drawn: list[list[int]] = []

    def __iter__(self) -> Iterator[list]:  # type: ignore[type-arg]
        order = self.rng.permutation(self.n)
        for i in range(0, self.n, self.batch):
            ids = list(order[i : i + self.batch])
            self.drawn.append([int(v) for v in ids])
            yield ids

    def __len__(self) -> int:
        return (self.n + self.batch - 1) // self.batch


class KeyedRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A dataset indexed by name, not by position (rows of a table keyed by file name)."""

    def __init__(self, n: int):
        self.rows = {f"row-{i}": (torch.randn(4), i % 2) for i in range(n)}

    def __getitem__(self, key: str) -> tuple[torch.Tensor, int]:
        return self.rows[key]

    def __len__(self) -> int:
        return len(self.rows)


def test_a_batchs_parts_that_hold_no_tensor_are_one_null_not_a_list_of_nulls(run_root: Path):
    # Ultralytics' YOLO batch: its tensors and, per sample, a file name and its original and resized sizes. Each of
    # those lists was a list of nulls as long as the batch in every step's batch_shape (3.5 KB a line at 64).
    n = 16
    batch = {
        "im_file": [f"images/train/{i}.jpg" for i in range(n)],
        "ori_shape": [(480, 640)] * n,
        "ratio_pad": [((1.0, 1.0), (0, 80))] * n,
        "img": torch.rand(n, 3, 8, 8),
        "cls": torch.zeros(40, 1),
        "meta": {"augmented": True, "sources": ["a", "b"]},
    }
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for b in watch.batches([batch, batch]):
            loss = model(b["img"]).pow(2).mean()
            watch.log(loss=loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    shapes = [s["batch_shape"] for s in watch_steps(watch)]
    expected = {"im_file": None, "ori_shape": None, "ratio_pad": None, "img": [n, 3, 8, 8], "cls": [40, 1]}
    expected["meta"] = None
    assert shapes == [expected, expected]


class Detector(nn.Module):
    """A model taken as torchvision's detection models are: a list of images, and in training their targets."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 4)

    def forward(self, images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        boxes = torch.stack([self.head(image.mean(dim=(1, 2))) for image in images])
        return {"loss_box_reg": (boxes - torch.stack([t["boxes"][0] for t in targets])).pow(2).mean()}


@pytest.mark.parametrize("batch", ["detection", "pairs", "two-tasks", "samples"])
def test_a_batch_of_one_tensor_a_sample_counts_its_samples_not_an_images_channels(run_root: Path, batch: str):
    # torchvision's detection references collate with tuple(zip(*batch)): a tuple of four (3, H, W) images and one
    # of their targets. The first tensor's first dimension, 3, was taken for the batch's size: 3 examples a step.
    # A siamese ((x1, x2), y) holds two inputs of len(y) samples each: still len(y), and a two-task
    # ((x1, x2), (y1, y2)) too. A batch left a list of its samples' (x, y) starts with a sequence of two tensors
    # too, but is not two samples: it is a list of tuples, which torch's collate never makes, and its length.
    g = torch.Generator().manual_seed(0)
    samples: Any  # (a list as its dataset)
    loader: DataLoader[Any]
    if batch == "detection":
        samples = [(torch.rand(3, 12, 16, generator=g), {"boxes": torch.rand(1, 4, generator=g)}) for _ in range(8)]
        loader = DataLoader(samples, batch_size=4, collate_fn=lambda b: tuple(zip(*b, strict=True)))
        model: nn.Module = Detector()
    elif batch == "pairs":
        samples = [((a, a.flip(0)), a.sum()) for a in torch.rand(8, 3, generator=g)]
        loader = DataLoader(samples, batch_size=4)
        model = nn.Linear(3, 1)
    elif batch == "two-tasks":
        samples = [((a, a.flip(0)), (a[:1], a[1:2])) for a in torch.rand(8, 3, generator=g)]
        loader = DataLoader(samples, batch_size=4)
        model = nn.Linear(3, 1)
    else:
        samples = [(a, torch.tensor(1)) for a in torch.rand(8, 3, generator=g)]
        loader = DataLoader(samples, batch_size=4, collate_fn=lambda b: b)
        model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for drawn in watch.batches(loader):
            if batch == "detection":
                loss = sum(model(list(drawn[0]), list(drawn[1])).values())
            elif batch in ("pairs", "two-tasks"):
                loss = (model(drawn[0][0]) - model(drawn[0][1])).pow(2).mean()
            else:
                loss = model(torch.stack([x for x, _ in drawn])).pow(2).mean()
            watch.log(loss=loss)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    steps = watch_steps(watch)
    assert len(steps) == 2
    for s in steps:
        # A batch left as the list of its samples was read by its first sample's first tensor: 3, the length of x.
        assert math.isclose(s["examples_per_s"] * (s["data_wait_s"] + s["compute_s"]), 4, rel_tol=1e-9)


def test_a_batch_left_as_its_samples_counts_them_and_other_lists_keep_their_first_tensors_rows():
    images = [torch.rand(3, 8, 8) for _ in range(5)]
    assert BatchInfo([(x, 1) for x in images]).size == 5  # (image, label) tuples: 5 samples, not 3 channels
    assert BatchInfo([{"image": x, "label": 1} for x in images]).size == 5  # dict samples (HF style)
    assert batch_size([{"image": x, "label": 1} for x in images]) == 5
    # Not a list of samples: tuples of different lengths, and torch's own collate of (x, y) pairs (a list of lists).
    assert BatchInfo([(torch.rand(6, 2), 1), (torch.rand(6, 2),)]).size == 6
    assert BatchInfo([[torch.rand(6, 2), torch.rand(6, 2)], [torch.rand(6), torch.rand(6)]]).size == 6


def test_a_samplers_numpy_or_tensor_ids_are_recorded_as_ints_and_named_keys_as_none(run_root: Path):
    # The numpy ints went into batch_ids as they were, and the ledger's encoder refused them: every step record
    # of the run was lost ("publisher degraded"). Keys that are not integers have no place in batch_ids.
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))
    sampler = NumpyBatchSampler(40, 8, seed=1)
    keyed = KeyedRows(16)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for loader in (
            torch.utils.data.DataLoader(data, batch_sampler=sampler),
            torch.utils.data.DataLoader(keyed, batch_sampler=[list(keyed.rows)[i : i + 4] for i in range(0, 16, 4)]),
            # A split given as a tensor of indices: the sampler yields 0-d tensors (their list went into batch_ids).
            torch.utils.data.DataLoader(
                data,
                batch_size=5,
                sampler=torch.utils.data.SubsetRandomSampler(torch.arange(0, 40, 2)),  # type: ignore[arg-type]
            ),
        ):
            for x, y in watch.batches(loader):
                loss = nn.functional.cross_entropy(model(x), y)
                watch.log(loss=loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    steps = watch_steps(watch)
    assert [s["batch_ids"] for s in steps[:9]] == [*sampler.drawn, None, None, None, None]
    split = [i for s in steps[9:] for i in s["batch_ids"]]
    assert sorted(split) == list(range(0, 40, 2))
    assert all(type(i) is int for s in steps[:5] + steps[9:] for i in s["batch_ids"])
    assert [r["status"] for r in records(watch.ledger_path, "publisher")] == ["ok"]  # type: ignore[arg-type]


class ShardBlocks(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Whole batches stored as blocks, keyed by (shard, block), served without batching (batch_size=None)."""

    def __init__(self) -> None:
        self.blocks = {(s, b): (torch.randn(4, 4), torch.randint(0, 2, (4,))) for s in range(2) for b in range(3)}

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.blocks[key]

    def __len__(self) -> int:
        return len(self.blocks)


class RowsAtOnce(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A dataset that fetches a batch in one call, given its indices as a list (batch_size=None, a BatchSampler)."""

    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 4), torch.randint(0, 2, (n,))

    def __getitem__(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[rows], self.y[rows]

    def __len__(self) -> int:
        return len(self.x)


def test_without_batching_a_tuple_key_is_one_sample_not_several_ids_and_a_list_of_rows_is_the_batchs_ids(
    run_root: Path,
):
    # batch_size=None: the sampler's item is the one key the dataset is asked for. A (shard, block) key was read
    # as the ids [shard, block], and the dump of a bad batch named two samples that were never in it.
    torch.manual_seed(0)
    blocks = ShardBlocks()
    rows = RowsAtOnce(12)
    batch_rows = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(rows), 4, drop_last=False)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for loader in (
            torch.utils.data.DataLoader(blocks, sampler=list(blocks.blocks), batch_size=None),
            torch.utils.data.DataLoader(rows, sampler=batch_rows, batch_size=None),
            torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(3, 4, 4)), batch_size=None),
        ):
            for batch in watch.batches(loader):
                x, y = (batch[0], torch.zeros(4, dtype=torch.long)) if len(batch) == 1 else batch
                loss = nn.functional.cross_entropy(model(x), y)
                watch.log(loss=loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    ids = [s["batch_ids"] for s in watch_steps(watch)]
    assert ids == [None] * 6 + [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] + [[0], [1], [2]]


class SignSGD(torch.optim.Optimizer):
    """A research optimizer whose param groups have a step size and no "lr"."""

    def __init__(self, params: Iterator[nn.Parameter], step_size: float = 0.01):
        super().__init__(params, {"step_size": step_size})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["step_size"])


def test_an_optimizer_whose_groups_have_no_lr_is_watched_and_its_lr_is_null(run_root: Path):
    # The optimizer post-hook read group["lr"]: a KeyError out of the user's optimizer.step() ended the run.
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = SignSGD(model.parameters())
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(30):
            train_step(watch, model, optimizer)
    steps = watch_steps(watch)
    assert len(steps) == 30
    assert all(s["lr"] == [None] and s["opt_step"] == s["step"] + 1 for s in steps)
    assert all(s["grad_norm"] > 0 for s in steps)
    assert [a["rule"] for a in _alerts(watch) if a["severity"] != "info"] == []
    assert records(watch.ledger_path, "end")[-1]["reason"] == "finished"  # type: ignore[arg-type]


def test_an_lr_a_schedule_computed_with_numpy_is_read_by_the_rules(run_root: Path):
    # A hand-written cosine schedule (g["lr"] = base * (1 + np.cos(...)) / 2) leaves numpy floats in the groups:
    # the ledger wrote them as numbers, but the rules read numbers by type and saw no lr at all (lr-zero, the
    # warm-up tests of loss-spike and loss-chance, no-update's message).
    import numpy as np

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for step in range(40):
            for group in optimizer.param_groups:  # a cosine from 0.1 to 0 over 20 steps, then 0
                group["lr"] = 0.1 * (1 + np.cos(np.pi * min(step, 20) / 20)) / 2
            train_step(watch, model, optimizer)
    steps = watch_steps(watch)
    assert steps[0]["lr"] == [0.1]
    assert steps[-1]["lr"] == [0.0]
    fired = [(a["rule"], a["step"]) for a in _alerts(watch) if a["severity"] != "info"]
    assert fired == [("lr-zero", 29)]  # the lr is 0 from step 20: ten optimizer steps at 0


def test_the_update_norms_schedule_counts_the_parameters_that_can_move(run_root: Path):
    # A LoRA adapter of 2,048 elements on a frozen 107k-parameter GPT-2 (a Trainer with peft) was sampled every
    # 100th step, as a model of 107k moving parameters would be: its passes are over the 2,048 only.
    backbone = nn.Sequential(nn.Linear(512, 256), nn.Linear(256, 16))  # 135,440 elements, frozen
    backbone.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        for _ in range(11):
            watch.step()
            loss = model(torch.randn(8, 512)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert watch.ledger_path is not None
    run = records(watch.ledger_path, "run")[0]
    assert (run["params"], run["update_norm_every"], run["param_norm_every"]) == (135_508, 10, 10)
    assert [s["opt_step"] for s in watch_steps(watch) if s["update_norm"] is not None] == [1, 11]
    full = Watch(nn.Sequential(nn.Linear(512, 256), nn.Linear(256, 16)), run_dir=run_root, system=False, quiet=True)
    full.close()
    assert full.update_norm_every == 100  # the same model, every weight trained


def test_a_fine_tuned_models_update_norm_copies_only_the_parameters_that_move_and_follows_an_unfreeze(
    run_root: Path,
):
    # The update norm copied every parameter before a sampled step: on a frozen 7B model with a LoRA adapter, a
    # 14 GB copy for a few MB that move (the run's OOM at its first step). Frozen weights do not move: their
    # update is 0 and they are not copied. A second stage that unfreezes the backbone is measured whole.
    torch.manual_seed(0)
    backbone, head = nn.Linear(64, 64), nn.Linear(64, 3)
    model = nn.Sequential(backbone, nn.ReLU(), head)
    backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # plain SGD: the update is lr x the gradient
    expected: list[float] = []
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, update_norm_every=1) as watch:
        for step in range(6):
            if step == 3:
                backbone.requires_grad_(True)  # stage two
            x, y = torch.randn(16, 64), torch.randint(0, 3, (16,))
            watch.step(x)
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            optimizer.zero_grad()
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            expected.append(0.1 * math.sqrt(sum(float(g.pow(2).sum()) for g in grads)))
            optimizer.step()
            copied = watch._hooks._kept_snapshot
            assert copied is not None
            assert sum(t.numel() for t in copied[1]) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert [s["update_norm"] for s in watch_steps(watch)] == pytest.approx(expected, rel=1e-5)
