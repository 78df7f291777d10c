"""The Watch API in-process with real torch on CPU: loops, optimizers, bad input, faults."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import tuiwatch
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record
from tuiwatch.ledger.writer import FileLedger
from tuiwatch.publisher import pending as steps_module
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.watch import Watch

from ..helpers import LOADED_MACHINE_S, env_for, records
from .loops import train_on


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _data(n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 2, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)]


def _ledger(watch: Watch) -> list[Record]:
    assert watch.ledger_path is not None
    return records(watch.ledger_path)


def test_bad_arguments_are_refused_with_one_line(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    with pytest.raises(ValueError, match="on_nonfinite must be one of stop, skip, warn"):
        Watch(model, opt, on_nonfinite="ignore", run_dir=run_root)
    with pytest.raises(TypeError, match=r"needs a torch\.nn\.Module"):
        Watch("model", opt, run_dir=run_root)  # type: ignore[arg-type]
    (run_root.parent / "file").write_text("")
    with pytest.raises(tuiwatch.TuiwatchError, match=r"cannot create the run directory .*run_dir=None"):
        Watch(model, opt, run_dir=run_root.parent / "file")
    with Watch(model, opt, run_dir=run_root) as watch:
        with pytest.raises(ValueError, match=r"close\(reason=\.\.\.\) must be one of"):
            watch.close("done")
        with pytest.raises(ValueError, match="lr is read from the optimizer's param groups"):
            watch.log(lr=0.1)
        with pytest.raises(ValueError, match="'grad_norm' is a field tuiwatch records itself"):
            watch.log(grad_norm=0.1)
        with pytest.raises(ValueError, match="step_per must be 'batch' or 'optimizer'"):
            Watch(model, opt, run_dir=run_root, step_per="micro")
        with pytest.raises(ValueError, match=r"log\(epoch=\.\.\.\) needs an integer >= 0, got 1.5"):
            watch.log(epoch=1.5)
        with pytest.raises(TypeError, match=r"step\(ids=\.\.\.\) needs a sequence of integers, got float"):
            watch.step(ids=1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"step\(data_wait_s=\.\.\.\) needs a number of seconds, got str"):
            watch.step(data_wait_s="1s")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"needs a scalar, got a tensor of shape \[2\]"):
            watch.log(loss=torch.ones(2))
        with pytest.raises(TypeError, match="needs a number or a scalar tensor, got str"):
            watch.log(loss="low")


def test_numpy_numbers_are_logged_as_plain_numbers_nan_included(run_root: Path, socket_dir: Path):
    # sklearn's metrics and many loops' running means are numpy scalars: orjson refuses them, which cost the
    # publisher thread a whole batch of records (the status went degraded) before they were logged as plain numbers.
    np = pytest.importorskip("numpy")
    model, opt = _mlp()
    with Watch(model, opt, run_dir=run_root, on_nonfinite="warn") as watch:
        for x, y in watch.batches(_data(2)):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss, acc=np.float64(0.75), right=np.int64(3), half=np.float32(0.5), auc=np.float64("nan"))
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert watch.status == "live"
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [(s["acc"], s["right"], s["half"]) for s in steps] == [(0.75, 3, 0.5)] * 2
    assert all(type(s["right"]) is int for s in steps)
    assert all(math.isnan(s["auc"]) for s in steps)  # written as "nan", never as null
    # A loop without batches() or an optimizer says its epoch and lr itself: `for epoch in np.arange(n)` gives
    # numpy ints, and an lr schedule computed with numpy numpy floats. Both were refused as "not a number".
    with Watch(model, None, run_dir=run_root / "by-hand") as watch:
        for epoch in np.arange(2):
            watch.step(data_wait_s=np.float32(0.5))
            loss = nn.functional.cross_entropy(model(torch.randn(4, 2)), torch.tensor([0, 1, 0, 1]))
            watch.log(loss=loss, epoch=epoch, lr=np.float32(0.25 / (epoch + 1)))
            loss.backward()
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [(s["epoch"], s["lr"], s["data_wait_s"]) for s in steps] == [(0, [0.25], 0.5), (1, [0.125], 0.5)]
    assert all(type(s["epoch"]) is int for s in steps)


def test_gradient_accumulation_puts_optimizer_fields_on_stepping_steps_only(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    with Watch(model, opt, run_dir=run_root) as watch:
        for i, (x, y) in enumerate(watch.batches(_data(8))):
            loss = nn.functional.cross_entropy(model(x), y) / 2
            watch.log(loss=loss)
            loss.backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [s["opt_step"] for s in steps] == [None, 1, None, 2, None, 3, None, 4]
    assert all((s["grad_norm"] is None) == (s["opt_step"] is None) for s in steps)
    assert all(s["lr"] == [0.1] for s in steps if s["opt_step"])
    assert all(s["finite"]["grad"] is None for s in steps if not s["opt_step"])
    assert steps[0]["batch_ids"] is None  # a plain list has no sampler


def test_a_gradscaler_skip_leaves_the_step_without_optimizer_fields(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    with Watch(model, opt, scaler=scaler, run_dir=run_root, on_nonfinite="warn") as watch:
        for i, (x, y) in enumerate(watch.batches(_data(3))):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            scaler.scale(loss).backward()
            if i == 1:
                model[0].weight.grad[0, 0] = math.inf  # type: ignore[index]
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [s["opt_step"] for s in steps] == [1, None, 2]


def test_nonfinite_stop_raises_before_the_update_and_ends_the_ledger(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    watch = Watch(model, opt, run_dir=run_root)
    data = _data(6)
    data[3][0][0, 0] = math.nan  # a corrupt sample in the data
    with pytest.raises(tuiwatch.NonFiniteError) as info:
        for x, y in watch.batches(data):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            opt.zero_grad()
    assert info.value.step == 3
    assert info.value.boundary == "batch"
    assert "first at step 3, boundary=batch" in str(info.value)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    ledger = _ledger(watch)
    bad = [r for r in ledger if r["kind"] == "step"][-1]
    assert bad["step"] == 3
    assert bad["finite"]["batch"] is False
    assert bad["finite"]["loss"] is False
    assert ledger[-1]["kind"] == "end"
    assert ledger[-1]["reason"] == "nonfinite"


def test_nonfinite_skip_leaves_model_and_optimizer_state_identical(run_root: Path, socket_dir: Path):
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with Watch(model, opt, run_dir=run_root, on_nonfinite="skip") as watch:
        for i, (x, y) in enumerate(watch.batches(_data(4))):
            loss = nn.functional.cross_entropy(model(x), y) * (math.inf if i == 2 else 1.0)
            watch.log(loss=loss)
            loss.backward()
            if i == 2:
                params = [p.detach().clone() for p in model.parameters()]
                state = {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state.items()}
            opt.step()
            if i == 2:
                assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True))
                for k, v in opt.state.items():
                    assert all(torch.equal(v[n], state[k][n]) for n in v)
            opt.zero_grad()
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [s["opt_step"] for s in steps] == [1, 2, None, 3]
    assert steps[2]["opt_skipped"] is True
    assert steps[2]["finite"]["loss"] is False


def test_a_loop_without_a_loader_uses_step(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    with Watch(model, opt, run_dir=run_root) as watch:
        for x, y in _data(5):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss, accuracy=0.5)
            loss.backward()
            opt.step()
            opt.zero_grad()
            watch.step()
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    assert all(s["accuracy"] == 0.5 and s["compute_s"] > 0 and s["batch_shape"] is None for s in steps)


def test_a_notebook_cell_run_again_closes_the_earlier_watch_of_the_same_model(
    run_root: Path, socket_dir: Path, capsys: pytest.CaptureFixture[str]
):
    # The earlier Watch stayed open: its run looked live for good, its hooks measured each of the new run's steps
    # again into its own last step (whose opt_step went on counting).
    model, opt = _mlp()

    def cell() -> Watch:
        watch = Watch(model, opt, name="nb", run_dir=run_root, system=False)
        for x, y in _data(3):
            watch.step()
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return watch

    first = cell()
    second = cell()
    assert (len(model._forward_hooks), len(opt._optimizer_step_pre_hooks)) == (1, 1)  # the second Watch's alone
    assert [r["reason"] for r in _ledger(first) if r["kind"] == "end"] == ["finished"]
    assert [s["opt_step"] for s in _ledger(first) if s["kind"] == "step"] == [1, 2, 3]
    other = nn.Linear(2, 2)  # another model's Watch leaves this one's open
    Watch(other, run_dir=None, system=False, quiet=True).close()
    assert not second._tracker.off
    second.close()
    assert [s["opt_step"] for s in _ledger(second) if s["kind"] == "step"] == [1, 2, 3]
    assert capsys.readouterr().err.splitlines() == [
        f"tuiwatch: nb: ledger {first.ledger_path}; watch it with: tuiwatch attach nb",
        f"tuiwatch: nb: closed (ledger {first.ledger_path}): a new Watch of the same model replaces it",
        f"tuiwatch: nb: ledger {second.ledger_path}; watch it with: tuiwatch attach nb",
    ]


def test_an_integer_metric_past_64_bits_is_written_as_its_float_and_costs_no_record(run_root: Path, socket_dir: Path):
    # It made the ledger's encoder raise: the publisher degraded and every step record was lost.
    model, opt = _mlp()
    with Watch(model, opt, run_dir=run_root) as watch:
        for x, y in _data(3):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss, tokens_seen=2**70, steps_seen=7)
            loss.backward()
            opt.step()
            opt.zero_grad()
            watch.step()
        with watch.validation():
            watch.log(val_big=-(2**64))
    assert watch.status == "closed"
    records = _ledger(watch)
    steps = [r for r in records if r["kind"] == "step"]
    assert [(s["tokens_seen"], s["steps_seen"]) for s in steps] == [(float(2**70), 7)] * 3
    assert [r["val_big"] for r in records if r["kind"] == "eval"] == [float(-(2**64))]
    assert not [r for r in records if r["kind"] == "publisher" and r["status"] == "degraded"]


def test_an_integrations_boundaries_timed_waits_and_late_gradients(run_root: Path, socket_dir: Path):
    """What the integrations use: step(data_wait_s=) opens or folds, end_step() ends after the optimizer
    stepped, and with late_gradients the norm is the one at gradients_ready(), not at optimizer.step()."""
    model, optimizer = _mlp()
    watch = Watch(
        model, optimizer, run_dir=run_root, system=False, step_per="optimizer", late_gradients=True, quiet=True
    )
    (x1, y1), (x2, y2) = _data(2)
    grads_at: list[float] = []
    watch.step((x1, y1), data_wait_s=0.5)
    watch.step((x2, y2), data_wait_s=0.25)  # before the optimizer stepped: a second micro-batch
    assert watch.end_step() is False  # nothing ends before the optimizer steps

    def closure() -> float:  # the gradients are made inside step(), after torch's step pre-hook
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.cat([x1, x2])), torch.cat([y1, y2]))
        loss.backward()
        watch.gradients_ready()
        grads_at.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).norm().item())
        return loss.item()

    optimizer.step(closure)
    assert watch.end_step() is True
    assert watch.end_step() is False  # no step open any more
    watch.close()
    (step,) = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert step["micro_batches"] == 2
    assert step["data_wait_s"] == pytest.approx(0.75)
    assert step["opt_step"] == 1
    assert step["grad_norm"] == pytest.approx(grads_at[0], rel=1e-6)


class WarmSGD(torch.optim.SGD):
    """An SGD of one's own that does something and calls its parent's step(), as subclasses do."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            group["lr"] = min(group["lr"] * 2, 0.1)  # a warm-up of its own
        return super().step(closure)


def test_a_subclass_whose_step_calls_its_parents_is_one_update_a_step(
    run_root: Path, capsys: pytest.CaptureFixture[str]
):
    # Once a plain SGD has been made, torch wraps SGD.step with the step hooks too, so they ran again inside the
    # subclass's step(): every step counted two optimizer steps, and its norms were read twice.
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    model, _ = _mlp()
    optimizer = WarmSGD(model.parameters(), lr=0.0125)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True) as watch:
        train_on(watch, model, optimizer, _data(4))
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4]
    assert [s["lr"] for s in steps] == [[0.025], [0.05], [0.1], [0.1]]
    assert capsys.readouterr().err == ""


def test_an_optimizer_stepping_twice_in_a_step_is_said_once(run_root: Path, capsys: pytest.CaptureFixture[str]):
    model, optimizer = _mlp()
    norms, losses = [], []
    with Watch(model, optimizer, name="halves", run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(_data(3)):
            for half in (slice(0, 2), slice(2, 4)):  # an update on each half of the batch
                loss = nn.functional.cross_entropy(model(x[half]), y[half])
                watch.log(loss=loss)
                losses.append(loss.item())
                optimizer.zero_grad()
                loss.backward()
                norms.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).norm())
                optimizer.step()
    steps = [r for r in _ledger(watch) if r["kind"] == "step"]
    assert [s["opt_step"] for s in steps] == [2, 4, 6]
    assert [s["grad_norm"] for s in steps] == pytest.approx([float(n) for n in norms[::2]], rel=1e-6)
    assert [s["loss"] for s in steps] == pytest.approx(losses[1::2])
    assert capsys.readouterr().err.splitlines() == [
        "tuiwatch: halves: the optimizer stepped more than once in step 0: a step's gradient and update norms are "
        "its first update's, its loss the last one logged; give each update a step of its own (watch.step() before it)"
    ]


class LogOfInput(nn.Module):
    """A model whose output is NaN for an input row below zero: a finite batch, a non-finite forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x[:, :1].log() + x)
        return out


def test_every_micro_batchs_forward_output_is_checked(run_root: Path):
    # With accumulation only the step's first forward was checked: a NaN the model made in a later micro-batch read
    # finite.forward true, and the alert named the loss as the first broken link.
    torch.manual_seed(0)
    model = LogOfInput()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.rand(4, 2) + 0.1, torch.randint(0, 2, (4,))) for _ in range(8)]
    batches[5][0][0, 0] = -1.0  # step 2's second micro-batch: finite, and the model's log makes it NaN
    with Watch(model, optimizer, run_dir=run_root, system=False, step_per="optimizer", on_nonfinite="warn") as watch:
        for i, (x, y) in enumerate(watch.batches(batches)):
            (nn.functional.cross_entropy(model(x), y) / 2).backward()
            if i % 2:
                optimizer.step()
                optimizer.zero_grad()
    ledger = _ledger(watch)
    steps = [r for r in ledger if r["kind"] == "step"]
    assert [s["micro_batches"] for s in steps] == [2, 2, 2, 2]
    # (under "warn" the NaN update went through: step 3's weights, and so its outputs, are NaN)
    assert [(s["finite"]["batch"], s["finite"]["forward"]) for s in steps] == [(True, True)] * 2 + [(True, False)] * 2
    (alert,) = [r for r in ledger if r["kind"] == "alert" and r["rule"] == "nonfinite"]
    assert alert["message"].startswith("first at step 2, boundary=forward")


def test_attention_mask_gives_the_token_count(run_root: Path, socket_dir: Path):
    model = nn.Embedding(10, 2)
    batch = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    with Watch(model, None, run_dir=run_root) as watch:
        for b in watch.batches([batch]):
            watch.log(loss=model(b["input_ids"]).sum())
    step = next(r for r in _ledger(watch) if r["kind"] == "step")
    assert step["tokens"] == 5
    assert step["batch_shape"] == {"input_ids": [2, 3], "attention_mask": [2, 3]}


def test_token_ids_are_counted_and_uint8_images_and_masks_are_not(run_root: Path, socket_dir: Path):
    # timm's loader collates its images as uint8 (N, 3, H, W): they were counted as 768 "tokens" a batch.
    model = nn.Linear(1, 1)
    batches = [
        (torch.randint(0, 9, (2, 5)), torch.zeros(2)),  # a language model's (batch, time) ids
        (torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8), torch.zeros(2)),
        (torch.ones(2, 5, dtype=torch.bool), torch.zeros(2)),
        (torch.randint(0, 9, (2, 5), dtype=torch.int32), torch.zeros(2)),
    ]
    with Watch(model, None, run_dir=run_root, system=False) as watch:
        for _ in watch.batches(batches):
            watch.log(loss=model(torch.ones(1)).sum())
    assert [r["tokens"] for r in _ledger(watch) if r["kind"] == "step"] == [10, None, None, 10]


def test_an_error_in_the_publisher_thread_degrades_but_never_reaches_training(
    run_root: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    original = steps_module.StepState.build
    calls = {"n": 0}

    def flaky_build(self):
        calls["n"] += 1
        if calls["n"] in (3, 4):
            raise RuntimeError("injected")
        return original(self)

    monkeypatch.setattr(steps_module.StepState, "build", flaky_build)
    model, opt = _mlp()
    with Watch(model, opt, run_dir=run_root) as watch:
        for x, y in watch.batches(_data(8)):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert watch.status == "closed"
    ledger = _ledger(watch)
    assert len([r for r in ledger if r["kind"] == "step"]) == 6
    assert ledger[-1]["status"] == "degraded"
    assert "injected" in ledger[-1]["error"]
    said = [line for line in capsys.readouterr().err.splitlines() if "tuiwatch" in line]
    assert len(said) == 2  # the start line, then one warning for the whole episode
    assert "degraded" in said[1]


def test_a_full_buffer_drops_the_oldest_and_says_so(tmp_path: Path):
    store = FileLedger(tmp_path / "ledger.jsonl")
    pipeline = Pipeline(store, capacity=10, system_interval_s=None)
    for i in range(15):
        pipeline.put({"kind": "step", "step": i})
    assert pipeline.dropped_records == 5
    pipeline.start()
    assert pipeline.close({"kind": "end", "t": 1.0, "reason": "finished", "steps": 15, "opt_steps": 0})
    ledger = list(read_ledger(tmp_path / "ledger.jsonl"))
    assert [r["step"] for r in ledger if r["kind"] == "step"] == list(range(5, 15))
    assert [r for r in ledger if r["kind"] == "publisher"][-1]["dropped_records"] == 5
    assert ledger[-1]["kind"] == "end"
    assert ledger[-1]["dropped_records"] == 5


def test_close_is_bounded_with_a_stalled_viewer(run_root: Path, socket_dir: Path):
    import socket as socketlib

    model, opt = _mlp()
    watch = Watch(model, opt, run_dir=run_root)
    viewer = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    viewer.connect(str(watch.socket_path))  # never reads
    for x, y in watch.batches(_data(8) * 50):
        watch.log(loss=nn.functional.cross_entropy(model(x), y))
    started = time.monotonic()
    watch.close()
    # close() waits at most 2 s by design; waiting for this viewer would never end.
    assert time.monotonic() - started < LOADED_MACHINE_S
    viewer.close()
    assert _ledger(watch)[-1]["kind"] == "end"


def test_without_a_run_dir_the_stream_still_works(socket_dir: Path):
    from tuiwatch.wire.protocol import connect, iter_records

    model, opt = _mlp()
    watch = Watch(model, opt, run_dir=None)
    assert watch.ledger_path is None
    assert watch.socket_path is not None
    for x, y in watch.batches(_data(4)):
        watch.log(loss=nn.functional.cross_entropy(model(x), y))
    sock = connect(watch.socket_path, timeout=10)
    watch.close()
    received = list(iter_records(sock))
    assert received[0]["kind"] == "run"
    assert received[-1]["kind"] == "end"
    assert [r["step"] for r in received if r["kind"] == "step"] == [0, 1, 2, 3]


def test_rules_run_inside_the_training_process_and_write_alerts(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    data = _data(6)
    data[3][0][0, 0] = math.nan
    with Watch(model, opt, run_dir=run_root, on_nonfinite="warn") as watch:
        for x, y in watch.batches(data):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            opt.zero_grad()  # warn mode: nothing stops the run; skip the poisoned update ourselves
        with watch.validation():
            watch.log(val_loss=0.5)  # model.eval() forgotten
    alerts = [r for r in _ledger(watch) if r["kind"] == "alert"]
    assert [(a["rule"], a["step"], a["severity"]) for a in alerts] == [
        ("nonfinite", 3, "critical"),
        ("nonfinite", 4, "info"),
        ("eval-mode", 5, "warning"),
    ]
    assert alerts[0]["evidence"]["boundary"] == "batch"


def test_the_run_record_keeps_the_rules_as_given_so_report_replays_the_same(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    config = {"loss-spike": False, "lr-zero": {"steps": np.int64(3)}}  # a numpy threshold: written as an int
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True, rules=config) as watch:
        pass
    assert _ledger(watch)[0]["rules"] == {"loss-spike": False, "lr-zero": {"steps": 3}}
    # An iterator is read once: the rules built and the rules recorded are the same.
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True, rules=iter(["nonfinite"])) as watch:
        pass
    assert _ledger(watch)[0]["rules"] == ["nonfinite"]
    diagnosis = watch._pipeline.diagnosis
    assert diagnosis is not None
    assert [type(rule).__name__ for rule in diagnosis.rules] == ["NonFinite"]


def test_unknown_rule_ids_are_refused_before_a_run_directory_exists(run_root: Path, socket_dir: Path):
    model, opt = _mlp()
    with pytest.raises(ValueError, match="unknown rule ids"):
        Watch(model, opt, run_dir=run_root, rules=["grad-explode"])
    assert not run_root.exists()


def test_a_tests_watch_listens_in_a_socket_directory_of_its_own(run_root: Path):
    # conftest's socket_dir, for every test: the suite's runs are not listed among those of whoever runs it.
    model, opt = _mlp()
    with Watch(model, opt, name="private", run_dir=run_root, system=False, quiet=True) as watch:
        assert watch.socket_path is not None
        assert watch.socket_path.parent == Path(os.environ["TUIWATCH_DIR"])
        assert watch.socket_path.parent.name.startswith("tw-")
        assert [p.name for p in watch.socket_path.parent.iterdir()] == [watch.socket_path.name]


def test_a_watch_says_where_its_ledger_is_once_and_every_path_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sock").mkdir(mode=0o700)
    monkeypatch.setenv("TUIWATCH_DIR", "sock")  # relative, as a user may write it
    model, opt = _mlp()
    with Watch(model, opt, name="abs", run_dir="runs", system=False) as watch:
        for x, y in watch.batches(_data(2)):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
    assert watch.ledger_path is not None
    assert watch.socket_path is not None
    for path in (watch.run_dir, watch.ledger_path, watch.socket_path):
        assert path is not None
        assert path.is_absolute()
    assert watch.run_record["run_dir"] == str(tmp_path / "runs" / watch.ledger_path.parent.name)
    assert watch.run_record["socket"] == str(tmp_path / "sock" / watch.socket_path.name)
    assert capsys.readouterr().err.splitlines() == [
        f"tuiwatch: abs: ledger {watch.ledger_path}; watch it with: tuiwatch attach abs"
    ]
    Watch(model, opt, run_dir=None, system=False, quiet=True).close()
    monkeypatch.setenv("TUIWATCH_QUIET", "1")
    Watch(model, opt, run_dir=None, system=False).close()
    assert capsys.readouterr().err == ""


def test_ranks_of_one_job_share_a_directory_by_run_id_and_a_bad_run_id_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        Watch(_mlp()[0], run_dir=tmp_path, run_id="  ", quiet=True)
    # Two ranks of a job, as the launcher's environment describes them (no process group needed to be named).
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        model, optimizer = _mlp()
        with Watch(model, optimizer, name="job", run_dir=tmp_path, run_id="exp/42", quiet=True) as watch:
            for x, y in watch.batches(_data(3)):
                loss = nn.functional.cross_entropy(model(x), y)
                watch.log(loss=loss)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        assert watch.run_dir == tmp_path / "job-exp-42" / f"rank{rank}"
    assert sorted(p.name for p in (tmp_path / "job-exp-42").iterdir()) == ["rank0", "rank1"]
    run = next(iter(read_ledger(tmp_path / "job-exp-42" / "rank1")))
    assert (run["run_id"], run["rank"], run["local_rank"], run["world_size"]) == ("exp/42", 1, 1, 2)


_PRINTS_ITS_NAME = """
import torch, tuiwatch
watch = tuiwatch.Watch(torch.nn.Linear(2, 2), run_dir=None, system=False)
print(watch.name)
watch.close()
"""


@pytest.mark.integration  # real Python processes, started as a Jupyter kernel and as a package would be
def test_the_default_name_of_a_notebook_and_of_a_package_says_which(tmp_path: Path, socket_dir: Path):
    """A Jupyter kernel's ``sys.argv[0]`` is ipykernel's ``ipykernel_launcher.py``: every notebook on a host was
    "ipykernel_launcher" in ``tuiwatch ls``. ``python -m package`` runs its ``__main__.py``: "__main__"."""
    kernel = tmp_path / "ipykernel_launcher.py"  # the file the kernel's command line names; its code is the cell's
    kernel.write_text(_PRINTS_ITS_NAME)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__main__.py").write_text(_PRINTS_ITS_NAME)

    said: list[str] = []

    def name(*argv: str, **env: str) -> str:
        done = subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, env={**env_for(socket_dir), **env}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        said.append(done.stderr)
        return done.stdout.strip()

    assert name(str(kernel), JPY_SESSION_NAME="experiments/Train ResNet.ipynb") == "Train ResNet"
    assert said[-1].rstrip().endswith("watch it with: tuiwatch attach 'Train ResNet'")  # one word for the shell
    assert name(str(kernel), JPY_SESSION_NAME="") == "notebook"  # a kernel Jupyter Server did not start
    assert name("-m", "trainer") == "trainer"
