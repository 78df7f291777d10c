"""A Watch the loop let go of without ``close()`` ends its run and frees what it held (publisher/collected.py).

Written after a sweep of fifteen trials, each with a Watch it never closed (as
an Optuna objective that a pruned trial leaves by an exception does), ended
with fifteen publisher threads, 113 open files and all fifteen models, their
optimizers' state and their kept batches alive.
"""

from __future__ import annotations

import copyreg
import gc
import socket
import threading
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tuiwatch
from tuiwatch.ledger.records import Record
from tuiwatch.publisher import clipping, process
from tuiwatch.publisher.background.server import bind_private_socket
from tuiwatch.publisher.collected import weakly
from tuiwatch.publisher.commands import refused_after_end
from tuiwatch.wire.protocol import Command

from ..helpers import records, wait_until
from .loops import train_batches


def _publisher_threads() -> int:
    return sum(t.name == "tuiwatch-publisher" for t in threading.enumerate())


def _trial(run_root: Path, steps: int) -> dict[str, Any]:
    """One trial of a sweep: a model, its optimizer and a Watch, trained (clipping: torch's function is wrapped) and
    left unclosed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)
    train_batches(watch, model, optimizer, steps, clip=10.0)
    return {"model": model, "ledger": watch.ledger_path, "socket": watch.socket_path}


def _ended(ledger: Path) -> Record | None:
    last = records(ledger)[-1]
    return last if last["kind"] == "end" else None


def _wait_closed(ledger: Path, socket_path: Path | None) -> Record:
    """The end record, and then the thread's last act: its socket removed (it is written before the socket closes)."""
    end = wait_until(lambda: _ended(ledger), what="the end record")
    assert socket_path is not None
    wait_until(lambda: not socket_path.exists(), what="the run's socket to be removed")
    return end


def test_a_watch_let_go_of_unclosed_ends_its_run_and_frees_its_model(run_root: Path, socket_dir: Path):
    before = _publisher_threads()
    trial = _trial(run_root, 5)
    model = weakref.ref(trial.pop("model"))
    gc.collect()
    assert model() is None  # and with it the optimizer's state and the batches kept for dumps

    end = wait_until(lambda: _ended(trial["ledger"]), what="the end record")
    assert (end["reason"], end["steps"], end["opt_steps"]) == ("finished", 5, 5)
    assert [r["step"] for r in records(trial["ledger"], "step")] == [0, 1, 2, 3, 4]
    wait_until(lambda: _publisher_threads() == before, what="the publisher thread to stop")
    assert trial["socket"] is not None
    assert not trial["socket"].exists()
    assert clipping._installed == set()  # torch's clip functions are torch's again
    assert torch.nn.utils.clip_grad_norm_ is clipping._originals["clip_grad_norm_"]


def test_a_model_kept_after_its_watch_was_collected_is_a_plain_model_again(run_root: Path, socket_dir: Path):
    trial = _trial(run_root, 3)
    model: nn.Module = trial.pop("model")  # the trial's best model, kept; the Watch and the optimizer let go
    gc.collect()
    _wait_closed(trial["ledger"], trial["socket"])
    assert not model._forward_hooks
    assert not model._forward_hooks_always_called
    assert type(model) not in copyreg.dispatch_table  # its copies pickle as torch's own again
    model(torch.randn(4, 2)).sum().backward()  # and it runs, with nothing of the run behind it
    assert len(records(trial["ledger"], "step")) == 3


def test_an_unassigned_watch_keeps_watching_while_its_optimizer_lives(run_root: Path, socket_dir: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tuiwatch.Watch(model, optimizer, run_dir=run_root, system=False, quiet=True)  # the optimizer's hooks hold it
    gc.collect()
    assert [w.model for w in process.watches if w.model is model] == [model]
    socket_path = next(w.socket_path for w in process.watches if w.model is model)
    for _ in range(3):
        model(torch.randn(4, 2)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    ledger = next(run_root.glob("*/ledger.jsonl"))
    assert records(ledger, "end") == []
    assert model._forward_hooks
    del optimizer
    gc.collect()
    _wait_closed(ledger, socket_path)
    assert not [w for w in process.watches if w.model is model]
    assert not model._forward_hooks


def test_a_command_to_a_run_whose_watch_is_gone_is_refused_in_one_line():
    class Runner:
        def on_command(self, command: Command) -> None:
            return None

    runner = Runner()
    on_command = weakly(runner.on_command, refused_after_end)
    command = Command(cmd="checkpoint", id=7)
    assert on_command(command) is None  # queued, as before
    del runner
    gc.collect()
    reply = on_command(command)
    assert (reply["ok"], reply["id"], reply["error"]) == (False, 7, "the run has ended")


def test_a_run_ending_leaves_a_socket_bound_over_its_path_in_place(run_root: Path, socket_dir: Path):
    """A sweep whose trials share a name: the next trial's Watch bound the same socket path while the collected
    one's thread was still closing, and that thread removed the path, the new run's socket with it. The next trial
    now takes a name of its own (tests/wire/test_socket_names.py); a run's close still removes only the file it
    bound."""
    first = tuiwatch.Watch(nn.Linear(2, 2), run_dir=run_root, name="trial", system=False, quiet=True)
    assert first.socket_path is not None
    path = first.socket_path
    later = bind_private_socket(path)  # another listener took the path over
    try:
        first.close()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as viewer:
            viewer.connect(str(path))  # the later listener is still reachable
    finally:
        later.close()
        path.unlink()


def test_the_step_a_collected_watch_had_open_is_its_run_s_last(run_root: Path, socket_dir: Path):
    # A loop that marks no steps leaves its last step open when it returns; the Watch collected then had it, and the
    # run's last update was missing from the ledger (its end said 19 steps of 20).
    def trial() -> tuple[list[float], Path | None, Path | None]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        watch = tuiwatch.Watch(model, optimizer, run_dir=run_root, name="unmarked", system=False, quiet=True)
        losses = []
        for _ in range(20):
            x = torch.randn(8, 2)
            loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            watch.log(loss=loss.item())
            losses.append(loss.item())
        return losses, watch.ledger_path, watch.socket_path

    losses, ledger, socket_path = trial()
    gc.collect()
    assert ledger is not None
    end = _wait_closed(ledger, socket_path)
    assert (end["steps"], end["opt_steps"]) == (20, 20)
    steps = records(ledger, "step")
    assert [s["loss"] for s in steps] == losses
    assert steps[-1]["compute_s"] is None  # its end was not seen: not a made-up time
    assert all(s["compute_s"] is not None for s in steps[:-1])
