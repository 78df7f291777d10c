"""A job's relay: a rank faster than any viewer needs has its step records thinned (and says how many), every
other record passes; the viewer's side reads the labels into each rank's records."""

from __future__ import annotations

import shlex
import threading
from typing import Any

import orjson

from tuiwatch.ledger.codec import encode
from tuiwatch.viewer.messages import RecordsReceived, SourceDisconnected
from tuiwatch.viewer.ranks import RanksState
from tuiwatch.viewer.sources import RelaySource
from tuiwatch.viewer.views import ranks_view
from tuiwatch.wire.job_relay import Thinning, label


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(encode(r) for r in records)


def test_a_rank_over_the_limit_has_that_seconds_further_steps_left_out_and_counted():
    now = [100.0]
    thinning = Thinning(limit=3, clock=lambda: now[0])
    steps = lines(*({"kind": "step", "step": n} for n in range(5)))
    alert = lines({"kind": "alert", "rule": "nonfinite", "step": 4})
    kept, said = thinning.lines(0, steps + alert)
    assert [orjson.loads(x)["step"] for x in kept.splitlines()] == [0, 1, 2, 4]  # 3 steps, then the alert
    assert said == 0
    kept, said = thinning.lines(1, steps[: steps.index(b"\n") + 1])  # another rank has its own second
    assert kept.count(b"\n") == 1
    now[0] += 0.5
    kept, said = thinning.lines(0, lines({"kind": "step", "step": 5}, {"kind": "system", "rss": 1}))
    assert [orjson.loads(x)["kind"] for x in kept.splitlines()] == ["system"]
    assert said == 0
    now[0] += 0.6  # a new second: what the last one left out is said once
    kept, said = thinning.lines(0, lines({"kind": "step", "step": 6}))
    assert kept == lines({"kind": "step", "step": 6})
    assert said == 3
    assert thinning.lines(0, b"")[1] == 0


def test_the_viewer_side_splits_a_relay_stream_by_rank_and_counts_what_was_thinned():
    stream = b"".join(
        [
            label(name="ddp", run_id="j", world_size=2, host="h", ranks=[0, 1]),
            label(rank=1),
            lines({"kind": "step", "step": 0, "data_wait_s": 0.1, "compute_s": 0.2}),
            label(rank=0),
            lines({"kind": "step", "step": 0, "data_wait_s": 0.0, "compute_s": 0.2}),
            label(rank=1, thinned=250),
            label(rank=1, closed="the run closed the connection"),
        ]
    )
    got: list[Any] = []
    done = threading.Event()

    def post(message: Any) -> None:
        got.append(message)
        if isinstance(message, SourceDisconnected) and message.rank == 0:
            done.set()

    relay = RelaySource(["sh", "-c", f"printf %s {shlex.quote(stream.decode())}"], "h", [0, 1])
    relay.start(post)
    assert done.wait(20)
    ranks = RanksState([0, 1], 2)
    for message in got:
        if isinstance(message, RecordsReceived) and message.rank is not None:
            ranks.apply(message.rank, message.records, 0.0)
    gone = [(m.rank, m.reason) for m in got if isinstance(m, SourceDisconnected)]
    assert gone == [(1, "h: the run closed the connection"), (0, "h: the relay ended")]
    assert [ranks.ranks[r].step for r in (0, 1)] == [0, 0]
    assert list(ranks.ranks[1].data_wait_s) == [0.1]
    assert [row.thinned for row in ranks_view(ranks, 0.0).rows] == [0, 250]
