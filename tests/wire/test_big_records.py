"""A batch of 200,000 samples, or any oversized record, costs neither the ledger's readers nor the viewer (issue 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tuiwatch import Watch
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.publisher.pending import MAX_RECORD_IDS, ids_digest
from tuiwatch.viewer.messages import SourceDisconnected
from tuiwatch.viewer.sources import FileSource, reading_thread
from tuiwatch.viewer.state import RunState
from tuiwatch.wire.protocol import LineSplitter, ProtocolError


def test_a_huge_batch_records_its_first_ids_their_count_and_a_digest(run_root: Path, socket_dir: Path):
    n = 20_000
    data = TensorDataset(torch.randn(n, 2), torch.randint(0, 2, (n,)))
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True) as watch:
        for x, y in watch.batches(DataLoader(data, batch_size=n, shuffle=True)):
            loss = nn.functional.cross_entropy(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
    assert watch.ledger_path is not None
    step = next(r for r in read_ledger(watch.ledger_path) if r["kind"] == "step")
    assert len(step["batch_ids"]) == MAX_RECORD_IDS
    assert step["batch_ids_count"] == n
    assert len(orjson.dumps(step)) < 64 * 1024  # a line any reader takes
    assert len(step["batch_ids_digest"]) == 16
    assert ids_digest(list(range(n))) != ids_digest(list(range(1, n + 1)))  # another batch, another digest


def test_a_reader_of_a_run_skips_an_oversized_line_and_counts_it():
    line = b"x" * 3_000_000
    splitter = LineSplitter(1 << 20, skip_long=True)
    got = []
    for chunk in (b'{"a":1}\n' + line[:1_500_000], line[1_500_000:] + b'\n{"b":2}\n'):
        got += splitter.feed(chunk)
    assert got == [b'{"a":1}', b'{"b":2}']
    assert splitter.skipped == 1
    with pytest.raises(ProtocolError):  # the run's server still refuses a viewer's huge command outright
        LineSplitter(1 << 20).feed(line)


def test_a_replay_shows_every_other_record_and_says_one_was_skipped(tmp_path: Path):
    records: list[dict[str, Any]] = [{"kind": "run", "t": 0.0, "name": "big", "run_id": "x"}]
    records += [{"kind": "step", "t": float(i), "step": i, "loss": 1.0} for i in range(5)]
    lines = [orjson.dumps(r) for r in records]
    lines.insert(3, orjson.dumps({"kind": "step", "t": 9.0, "step": 99, "batch_ids": list(range(300_000))}))
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    state, posted = RunState(), list[Any]()
    FileSource(path)._run(posted.append)
    for message in posted:
        state.apply_all(getattr(message, "records", []))
    assert state.step == 4
    assert state.metrics["loss"].count == 5
    (alert,) = state.alerts
    assert (alert.rule, alert.severity) == ("viewer", "warning")
    assert alert.message == "1 record(s) over 1 MiB skipped: not shown"


def test_a_replay_of_a_hostile_ledger_ends_with_what_it_could_read(tmp_path: Path):
    lines = [
        b'{"kind": "run", "t": 0.0, "name": "hostile"}',
        b'{"kind": "step", "t": 1.0, "step": 1, "loss": 1.0, "x": ' + b"[" * 600 + b"]" * 600 + b"}",
        b'{"kind": "step", "t": 1.7976931348623157e308, "step": 2, "loss": 1.7976931348623157e308}',
        b'{"kind": "step", "t": -1.7976931348623157e308, "step": 3, "loss": -1.7976931348623157e308}',
        b"\xff\xfe not json",
        b'{"kind": "end", "t": 4.0, "step": 3, "reason": "finished"}',
    ]
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    state, posted = RunState(), list[Any]()
    reading_thread(FileSource(path)._run, posted.append, "test").run()  # on this thread: the guard included
    for message in posted:
        state.apply_all(getattr(message, "records", []))
    assert type(posted[-1]).__name__ == "SourceEnded"
    assert (state.status, state.step, state.metrics["loss"].count) == ("finished", 3, 2)


def test_a_reader_that_fails_says_so_instead_of_leaving_the_viewer_connecting():
    posted: list[Any] = []

    def broken(post: Any) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    reading_thread(broken, posted.append, "test").run()
    (message,) = posted
    assert isinstance(message, SourceDisconnected)
    assert message.reason == "the reader stopped: RecursionError: maximum recursion depth exceeded"
