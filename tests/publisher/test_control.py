"""Commands from a real client to a real training process: checkpoint, dump, pause, resume, stop."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tuiwatch
from tuiwatch.publisher.checkpoints import Checkpoint
from tuiwatch.publisher.control import MAX_QUEUED, CommandQueue
from tuiwatch.wire.protocol import Command, command_line, connect, iter_records
from tuiwatch.wire.socketdir import list_sockets

from ..helpers import finish, ledger_file, load_truth, records, start_training, wait_until

pytestmark = pytest.mark.integration  # commands over a real socket to real trainings


class Client:
    """A viewer without a screen: sends commands, reads records until the replies it waits for."""

    def __init__(self, socket_dir: Path):
        path = wait_until(lambda: next(iter(list_sockets(socket_dir)), None), what="the run's socket").path
        self.sock = connect(path, timeout=30)
        self.records = iter_records(self.sock)
        self.seen: list[dict[str, Any]] = []

    def send(self, cmd: str, cmd_id: int, at: int | None = None) -> None:
        self.sock.sendall(command_line(cmd, cmd_id, at))

    def reply(self, cmd_id: int, ok: bool | None = None) -> dict[str, Any]:
        """The next reply to ``cmd_id`` (with that ``ok``, when given), reading as far as needed."""
        for record in itertools.chain(list(self.seen), self._new()):
            if record.get("kind") == "action" and record.get("id") == cmd_id and ok in (None, record["ok"]):
                return record
        raise AssertionError(f"the run closed the connection before replying to command {cmd_id}")

    def _new(self) -> Iterator[dict[str, Any]]:
        for record in self.records:
            self.seen.append(record)
            yield record

    def until_step(self, step: int) -> None:
        for record in self._new():
            if record.get("kind") == "step" and record["step"] >= step:
                return
        raise AssertionError(f"the run ended before step {step}")

    def close(self) -> None:
        self.sock.close()


def test_a_checkpoint_taken_mid_run_resumes_the_run_exactly(run_root: Path, socket_dir: Path, tmp_path: Path):
    straight = start_training(run_root / "a", socket_dir, "--steps", "60", truth=tmp_path / "a.jsonl")
    finish(straight)
    paced = start_training(
        run_root / "b", socket_dir, "--steps", "60", "--step-sleep", "0.02", truth=tmp_path / "b.jsonl"
    )
    client = Client(socket_dir)
    client.until_step(11)  # mid-epoch: 8 batches per epoch
    client.send("checkpoint", 7)
    reply = client.reply(7)
    client.close()
    finish(paced)
    assert reply["ok"] is True, reply
    path = Path(reply["path"])
    assert path.parent.name == "checkpoints"
    assert path.name == f"step-{reply['steps_done']}.pt"
    assert reply["bytes"] == path.stat().st_size
    assert Path(reply["dump"]).is_dir()
    assert [r for r in records(ledger_file(run_root / "b"), "action") if r["id"] == 7] == [reply]

    ckpt = tuiwatch.load_dump(path)
    assert isinstance(ckpt, Checkpoint)
    k = ckpt.step
    assert k == reply["steps_done"]
    assert 11 < k < 30
    assert (ckpt.epoch, ckpt.batch_index) == (k // 8, k % 8)
    assert ckpt.opt_steps == k
    assert set(ckpt.model) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert isinstance(ckpt.optimizer, dict)  # one optimizer: its state dict as it is (a list for several)
    assert ckpt.optimizer["state"]
    assert isinstance(ckpt.scheduler, dict)
    assert ckpt.scheduler["last_epoch"] == k
    assert set(ckpt.rng) >= {"python", "torch", "numpy"}
    assert ckpt.epoch_rng is not None
    assert ckpt.epoch_rng["loader_generator"] is not None
    assert ckpt.versions["torch"] == torch.__version__

    resumed = start_training(
        run_root / "c", socket_dir, "--steps", str(k + 20), "--resume", str(path), truth=tmp_path / "c.jsonl"
    )
    finish(resumed)
    expected = load_truth(tmp_path / "a.jsonl")[k : k + 20]
    got = load_truth(tmp_path / "c.jsonl")
    assert [r["step"] for r in got] == list(range(k, k + 20))
    assert [(r["loss"], r["lr"], r["ids"]) for r in got] == [(r["loss"], r["lr"], r["ids"]) for r in expected]
    steps = records(ledger_file(run_root / "c"), "step")
    assert steps[0]["step"] == k


def test_a_command_with_at_runs_at_that_step_and_one_past_it_at_once(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "400", "--step-sleep", "0.01")
    client = Client(socket_dir)
    client.until_step(3)
    # "at": the boundary with that many steps done (what a viewer sends every rank of a job).
    client.send("checkpoint", 1, at=40)
    client.send("dump", 2, at=2)  # already past: runs at the next boundary
    late, early = client.reply(1), client.reply(2)
    client.send("stop", 3)
    client.reply(3)
    client.close()
    finish(proc)
    assert late["ok"] is True
    assert (late["steps_done"], late["step"]) == (40, 39)
    assert Path(late["path"]).name == "step-40.pt"
    assert early["ok"] is True
    assert 3 <= early["step"] < 39
    actions = [r["id"] for r in records(ledger_file(run_root), "action")]
    assert actions == [2, 1, 3]


def test_dump_pause_resume_and_commands_run_once_in_order(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "400", "--step-sleep", "0.01")
    client = Client(socket_dir)
    client.until_step(5)
    # Two commands in one write (one step), and a repeated id.
    client.sock.sendall(command_line("dump", 1) + command_line("pause", 2) + command_line("dump", 1))
    dumped, paused = client.reply(1, ok=True), client.reply(2)
    assert dumped["ok"] is True
    assert Path(dumped["path"]).is_dir()
    assert paused["ok"] is True
    refused = client.reply(1, ok=False)  # answered at once, to this viewer only
    assert "already received" in refused["error"]
    paused_at = time.monotonic()
    # While paused, commands are still served, and no step happens.
    client.send("checkpoint", 3)
    assert client.reply(3)["ok"] is True
    client.send("pause", 4)
    assert "already paused" in client.reply(4)["error"]
    ledger = ledger_file(run_root)
    last = records(ledger, "step")[-1]["step"]
    while time.monotonic() - paused_at < 2.0:
        assert records(ledger, "step")[-1]["step"] == last
        time.sleep(0.1)  # the pause's length is what is tested: 2 s without a step
    client.send("resume", 5)
    assert client.reply(5)["ok"] is True
    client.until_step(last + 3)
    client.send("stop", 6)
    stop = client.reply(6)
    client.close()
    finish(proc)
    assert stop["ok"] is True
    assert Path(stop["path"]).name.startswith("step-")
    ledger_records = records(ledger)
    actions = [(r["action"], r["id"], r["ok"]) for r in ledger_records if r["kind"] == "action"]
    assert actions == [
        ("dump", 1, True),
        ("pause", 2, True),
        ("checkpoint", 3, True),
        ("pause", 4, False),
        ("resume", 5, True),
        ("stop", 6, True),
    ]
    steps = records(ledger, "step")
    around = next(s for s in steps if s["step"] == last + 1)
    # The pause lasted over 2 s: counted as data wait or compute it would show here.
    assert around["data_wait_s"] < 1.0
    assert all(s["compute_s"] < 1.0 for s in steps)
    assert ledger_records[-1]["kind"] == "end"
    assert ledger_records[-1]["reason"] == "stopped"
    assert steps[-1]["step"] < 399


def test_stop_raise_ends_with_stop_requested_and_a_final_checkpoint(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "400", "--step-sleep", "0.01", "--stop-mode", "raise")
    client = Client(socket_dir)
    client.until_step(3)
    client.send("stop", 1)
    stop = client.reply(1)
    client.close()
    out, _ = finish(proc)
    assert out.startswith("stopped: a viewer asked the run to stop at step")
    assert Path(stop["path"]).exists()
    ledger_records = records(ledger_file(run_root))
    assert ledger_records[-1]["reason"] == "stopped"


def test_a_run_without_a_run_directory_refuses_a_checkpoint_with_the_reason(socket_dir: Path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = tuiwatch.Watch(model, opt, run_dir=None, system=False)
    assert watch.socket_path is not None
    sock = connect(watch.socket_path)
    sock.sendall(command_line("checkpoint", 1))
    wait_until(lambda: watch._commands.pending() or None, what="the command to arrive")
    for _ in watch.batches([torch.ones(1, 2)] * 2):
        pass
    watch.close()
    reply = next(r for r in iter_records(sock) if r.get("kind") == "action")
    assert reply["ok"] is False
    assert reply["error"] == "this run has no run directory (Watch(run_dir=None)): nowhere to write"


def test_a_full_disk_refuses_the_checkpoint_and_training_goes_on(
    tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from tuiwatch.publisher.atomic import Directory

    monkeypatch.setattr(Directory, "free_bytes", lambda self: 1 << 20)  # a disk with 1 MiB left
    model = torch.nn.Linear(2, 2)
    watch = tuiwatch.Watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path, system=False)
    from tuiwatch.wire.protocol import Command

    assert watch._commands.on_command(Command("checkpoint", 1)) is None
    steps = 0
    for _ in watch.batches([torch.ones(1, 2)] * 3):
        steps += 1
    watch.close()
    reply = next(r for r in tuiwatch.read_ledger(watch.run_dir or "") if r["kind"] == "action")
    assert steps == 3
    assert reply["ok"] is False
    assert reply["error"].startswith("not enough space in ")
    assert "free space or move run_dir" in reply["error"]
    assert not list((tmp_path).glob("*/checkpoints/*.pt"))


def test_a_flood_of_dumps_costs_the_run_one_dump_and_the_next_is_rate_limited(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--steps", "2000", "--step-sleep", "0.005")
    flood = Client(socket_dir)
    flood.until_step(5)
    # 3,000 dumps in one write: the first 16 wait as one dump (coalesced), the rest are refused "busy" at once;
    # the server drops a viewer that lets its replies pile up, which this one does.
    flood.sock.sendall(b"".join(command_line("dump", i) for i in range(1, 3001)))
    ledger = ledger_file(run_root)
    wait_until(lambda: any(r["kind"] == "action" and r["ok"] for r in records(ledger)) or None, what="the dump")
    flood.close()
    client = Client(socket_dir)
    client.send("dump", 5000)  # right behind the flood: joins a waiting dump, or one a second at most
    late = client.reply(5000)
    # Or, on a loaded machine, "busy": the flood's first read can span a boundary, and the 16 of its tail that
    # queued after it still wait when this one comes (they then run as one dump, refused "at most one a second").
    assert (
        late.get("coalesced_with") is not None
        or late["error"].endswith("ago: at most one a second")
        or late["error"].startswith("busy: 16 commands already wait")
    ), late
    first = next(r for r in records(ledger) if r["kind"] == "action" and r["ok"])
    client.until_step(first["step"] + 50)  # training goes on
    client.close()
    finish(proc)
    actions = [r for r in records(ledger) if r["kind"] == "action"]
    runs = [r for r in actions if r["ok"] and "coalesced_with" not in r]
    assert 1 <= len(runs) <= 2  # one, and another only if the flood was still arriving a second later
    assert len(list(ledger.parent.glob("dumps/*-request"))) == len(runs)
    by_id = {r["id"]: r for r in actions if "coalesced_with" not in r}
    for r in actions:
        if "coalesced_with" in r:  # answered with the command it joined: the same outcome, step and directory
            base = by_id[r["coalesced_with"]]
            assert [r.get(k) for k in ("ok", "path", "step", "error")] == [
                base.get(k) for k in ("ok", "path", "step", "error")
            ]
        elif not r["ok"]:
            assert r["error"].endswith("at most one a second"), r


def test_the_same_command_sent_while_one_waits_runs_once_and_answers_every_id():
    queue = CommandQueue()
    assert [queue.offer(Command(cmd, i)) for i, cmd in enumerate(["pause", "dump", "pause", "pause"], 1)] == [None] * 4
    assert queue.offer(Command("dump", 2)) == "command id 2 was already received; each id runs once"
    taken = queue.take(0)
    assert [(q.command, q.also) for q in taken] == [(Command("pause", 1), [3, 4]), (Command("dump", 2), [])]
    assert not queue
    for i in range(MAX_QUEUED):
        assert queue.offer(Command("dump", 100 + i)) is None
    assert (
        queue.offer(Command("stop", 999))
        == "busy: 16 commands already wait for the next step boundary; send it again later"
    )
    assert [len(q.also) for q in queue.take(0)] == [MAX_QUEUED - 1]
    assert queue.offer(Command("stop", 1000)) is None  # taken: room again


def test_a_queued_command_with_at_waits_for_its_step_and_joins_only_its_twin():
    queue = CommandQueue()
    assert queue.offer(Command("checkpoint", 1, at=10)) is None
    assert queue.offer(Command("checkpoint", 2, at=12)) is None
    assert queue.offer(Command("checkpoint", 3, at=10)) is None
    assert queue.offer(Command("dump", 4)) is None
    assert [(q.command.id, q.also) for q in queue.take(9)] == [(4, [])]
    assert [(q.command.id, q.also) for q in queue.take(10)] == [(1, [3])]
    assert queue.take(11) == []
    assert [q.command.id for q in queue.take(15)] == [2]
    assert not queue
