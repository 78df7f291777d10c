"""The viewer's fold of a multi-rank job, from small hand-made streams: what the main state takes, each rank's
row and status, the straggler the rule names, and one answer for a command sent to every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tuiwatch.cli.replay import replay_source
from tuiwatch.ledger.records import Record
from tuiwatch.viewer.panes.header import HeaderBar
from tuiwatch.viewer.panes.metrics import MetricsPane
from tuiwatch.viewer.panes.ranks import COLUMNS, RanksPane, columns_for
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.ranks import STALE_S, RanksState
from tuiwatch.viewer.sources import RanksSource
from tuiwatch.viewer.state import RunState, describe_action
from tuiwatch.viewer.views import MAX_RANK_ROWS, ranks_view
from tuiwatch.wire.discovery import LiveJob, LiveRun, group_jobs
from tuiwatch.wire.protocol import Command, ProtocolError, command_line, parse_command

from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, shown, until, write_ledger


def step(n: int, wait: float = 0.001, forward: float = 0.002, backward: float = 0.004, **extra: Any) -> dict[str, Any]:
    compute = forward + backward + 0.001
    return {
        "kind": "step",
        "step": n,
        "data_wait_s": wait,
        "compute_s": compute,
        "forward_s": forward,
        "backward_s": backward,
        "optimizer_s": 0.001,
        "loss": 1.0 / (n + 1),
        **extra,
    }


def run(rank: int) -> dict[str, Any]:
    return {"kind": "run", "name": "ddp", "run_id": "job-1", "rank": rank, "world_size": 2, "host": f"h{rank}"}


def test_the_main_state_takes_the_lead_ranks_records_and_every_ranks_alerts():
    ranks = RanksState([0, 1], 2)
    alert = {"kind": "alert", "rule": "nonfinite", "severity": "critical", "step": 3, "message": "loss is nan"}
    main = ranks.apply(0, [run(0), step(0), step(1)], now=10.0)
    main += ranks.apply(1, [run(1), step(0), step(1), step(2), alert], now=10.0)
    assert [r["kind"] for r in main] == ["run", "step", "step", "alert"]
    assert main[-1]["rank"] == 1
    state = RunState()
    state.apply_all(main)
    assert state.step == 1  # the lead rank's
    assert [(a.rank, a.rule, a.step) for a in state.alerts] == [(1, "nonfinite", 3)]
    assert [(s.rank, s.host, s.step) for s in ranks.ranks.values()] == [(0, "h0", 1), (1, "h1", 2)]
    # Kept to show again when the lead rank's stream starts over: not the lead's own (its replay brings them).
    assert [a["rule"] for a in ranks.kept_alerts()] == ["nonfinite"]


def connected(ranks: RanksState) -> RanksState:
    for rank in ranks.ranks:
        ranks.connected(rank)
    return ranks


def sharded(rank: int) -> dict[str, Any]:
    return {**run(rank), "sharded": True}


def norms(grad: float | None, param: float | None = None, update: float | None = None) -> dict[str, Any]:
    return {"grad_norm": grad, "param_norm": param, "update_norm": update}


def test_a_sharded_jobs_norms_are_the_models_once_every_rank_has_sent_the_step():
    # FSDP: each rank measures its shard (3 and 4); the model's norm is the root of the sum of squares (5). The
    # charts were the lead rank's shard's.
    ranks = connected(RanksState([0, 1], 2))
    main = ranks.apply(0, [sharded(0), step(0, **norms(3.0, 6.0, 0.3)), step(1, **norms(0.6, 6.0))], now=10.0)
    assert [r["kind"] for r in main] == ["run"]  # the lead's steps wait for rank 1's
    main += ranks.apply(1, [sharded(1), step(0, **norms(4.0, 8.0, 0.4))], now=10.0)
    main += ranks.apply(1, [step(1, **norms(0.8, 8.0, 0.1))], now=10.0)
    steps = [(r["step"], r["grad_norm"], r["param_norm"], r["update_norm"], r["norms"]) for r in main[1:]]
    # step 1: rank 0 had no update norm, so the model's is not known
    assert steps == [(0, 5.0, 10.0, pytest.approx(0.5), "job"), (1, 1.0, 10.0, None, "job")]
    state = RunState()
    state.apply_all(main)
    assert (state.grad_norm.value_at(0), state.grad_norm.value_at(1)) == (5.0, 1.0)
    assert state.update_norm.end_step == 0  # no point at step 1


def test_a_step_a_rank_will_not_send_goes_on_without_the_models_norms_and_in_the_leads_order():
    ranks = connected(RanksState([0, 1], 2))
    evaluation = {"kind": "eval", "step": 1, "loss": 0.5}
    main = ranks.apply(
        0, [sharded(0), step(0, **norms(3.0)), step(1, **norms(3.0)), evaluation, step(2, **norms(3.0))], 1.0
    )
    main += ranks.apply(1, [sharded(1), step(0, **norms(4.0)), step(2, **norms(4.0))], now=1.0)  # step 1 thinned
    assert [(r["kind"], r.get("grad_norm")) for r in main] == [
        ("run", None), ("step", 5.0), ("step", None), ("eval", None), ("step", 5.0)
    ]  # fmt: skip
    main = ranks.apply(0, [step(3, **norms(3.0)), {"kind": "end", "reason": "finished"}], now=2.0)
    assert main == []  # rank 1 may still send step 3
    main = ranks.apply(1, [{"kind": "end", "reason": "finished"}], now=2.0)
    assert [(r["kind"], r.get("grad_norm")) for r in main] == [("step", None), ("end", None)]  # it never will
    ranks = connected(RanksState([0, 1], 2))
    ranks.apply(0, [sharded(0), step(0, **norms(3.0))], now=3.0)
    ranks.apply(1, [sharded(1)], now=3.0)
    assert [(r["step"], r["grad_norm"]) for r in ranks.disconnected(1)] == [(0, None)]  # no wait for its return
    assert [(r["step"], r["grad_norm"]) for r in ranks.apply(0, [step(1, **norms(3.0))], now=4.0)] == [(1, None)]


def test_a_sharded_job_the_viewer_has_part_of_keeps_each_ranks_shard_norm_and_says_so():
    ranks = RanksState([0], 2)  # rank 1 is on a host this viewer does not reach
    main = ranks.apply(0, [sharded(0), step(0, **norms(3.0))], now=1.0)
    assert [(r["kind"], r.get("grad_norm"), r.get("norms")) for r in main] == [("run", None, None), ("step", 3.0, None)]


def test_a_rank_is_live_then_stale_then_gone_and_an_ended_rank_says_how():
    ranks = RanksState([0, 1], 2)
    for rank in (0, 1):
        ranks.connected(rank)
        ranks.apply(rank, [run(rank), step(0)], now=100.0)
    rows = ranks.ranks
    assert rows[0].status(100.0 + STALE_S - 0.1) == "live"
    assert rows[0].status(100.0 + STALE_S + 0.1) == "stale"
    ranks.disconnected(0)
    assert rows[0].status(101.0) == "gone"
    ranks.apply(1, [{"kind": "end", "reason": "finished"}], now=101.0)
    ranks.disconnected(1)
    assert rows[1].status(500.0) == "finished"
    # A rank whose steps take longer than STALE_S is stale only after three of them.
    slow = RanksState([0], 1)
    slow.connected(0)
    slow.apply(0, [step(0, wait=0.0, forward=3.0, backward=6.0)], now=0.0)
    assert slow.ranks[0].status(20.0) == "live"
    assert slow.ranks[0].status(31.0) == "stale"


def test_a_rank_with_a_slow_loader_is_named_as_the_one_the_others_wait_for():
    ranks = RanksState([0, 1], 2)
    main: list[Record] = []
    for n in range(40):
        # Rank 1 waits 20 ms for its data; rank 0 waits those 20 ms at the all-reduce, inside its backward.
        main += ranks.apply(0, [step(n, wait=0.001, backward=0.024)], now=float(n))
        main += ranks.apply(1, [step(n, wait=0.021, backward=0.004)], now=float(n))
    (alert,) = [r for r in main if r["kind"] == "alert"]
    assert alert["rule"] == "straggler"
    assert alert["rank"] == 1
    assert alert["evidence"]["cause"] == "input"
    assert ranks.waited_for == 1
    view = ranks_view(ranks, 40.0)
    assert [(r.rank, r.waited_for) for r in view.rows] == [(0, False), (1, True)]
    assert view.rows[1].data_wait_s == pytest.approx(0.021)
    assert view.rows[0].backward_s == pytest.approx(0.024)
    assert view.summary is None
    # Each rank's data wait over steps, a line each, the same steps as its records.
    assert view.charted == (0, 1)
    assert view.wait is not None
    lines = {rank: line.series for rank, line in zip(view.charted, view.wait.lines, strict=True)}
    assert [line.role for line in view.wait.lines] == ["rank-a", "rank-b"]
    assert list(lines[1].recent) == [(n, 0.021) for n in range(40)]
    assert list(lines[0].recent)[-1] == (39, 0.001)


def test_a_reconnected_ranks_history_is_not_judged_again_but_a_restarted_ranks_steps_are():
    ranks = RanksState([0, 1], 2)
    for rank in (0, 1):
        ranks.connected(rank)
        ranks.apply(rank, [{**run(rank), "pid": 10 + rank}, *(step(n) for n in range(30))], now=1.0)
    judged = ranks.straggler.seen
    assert judged == 60
    ranks.connected(1)  # the same process again: its stream starts over at its run record and history
    ranks.apply(1, [{**run(1), "pid": 11}, *(step(n) for n in range(32))], now=2.0)
    assert ranks.straggler.seen == judged + 2  # only steps 30 and 31 are new
    assert ranks.ranks[1].step == 31
    ranks.connected(1)  # a new process for rank 1 (restarted): its steps from 0 are new
    ranks.apply(1, [{**run(1), "pid": 99}, *(step(n) for n in range(5))], now=3.0)
    assert ranks.straggler.seen == judged + 7


def test_a_large_job_is_summarised_with_the_ranks_worth_a_look():
    n = 64
    ranks = RanksState(range(n), n)
    for rank in range(n):
        ranks.connected(rank)
        slow = 0.05 if rank == 17 else 0.01
        ranks.apply(rank, [step(s, wait=slow) for s in range(10)], now=0.0)
    ranks.disconnected(40)
    view = ranks_view(ranks, 1.0)
    assert len(view.rows) <= MAX_RANK_ROWS
    shown = {r.rank: r for r in view.rows}
    assert shown[40].status == "gone"
    assert shown[17].slowest
    assert view.summary is not None
    assert view.summary.startswith("64 ranks: 1 gone, 63 live; steps 9–9; median step")
    # The slowest, then the lead, which is also the fastest (the others tie with it); no straggler named.
    assert view.charted == (17, 0)


def test_a_ranks_memory_is_its_device_memory_on_cuda_and_its_rss_off_it():
    ranks = RanksState([0, 1], 2)
    ranks.apply(0, [{**run(0), "device": "cuda:0"}, step(0, mem_allocated=1e9), step(1, mem_allocated=2e9)], 0.0)
    ranks.apply(0, [{"kind": "system", "rss": 5e8}], 0.0)  # not the memory of a CUDA rank
    ranks.apply(1, [{**run(1), "device": "cpu"}, step(0, mem_allocated=7.0), {"kind": "system", "rss": 3e8}], 0.0)
    assert list(ranks.ranks[0].memory_series.recent) == [(0, 1e9), (1, 2e9)]
    assert ranks.ranks[0].memory == 2e9
    assert list(ranks.ranks[1].memory_series.recent) == [(0, 3e8)]
    assert ranks.ranks[1].memory == 3e8


def test_a_command_to_every_rank_is_answered_once_when_every_rank_has():
    ranks = RanksState([0, 1], 2)
    for rank in (0, 1):
        ranks.connected(rank)
        ranks.apply(rank, [run(rank), step(0), step(1)], now=1.0)
    state = RunState()
    state.command_sent(7, "checkpoint")
    ranks.sent(7, "checkpoint", [0, 1])
    reply = {"kind": "action", "id": 7, "action": "checkpoint", "ok": True, "step": 9, "steps_done": 10}
    assert ranks.apply(0, [{**reply, "path": "/r/rank0/checkpoints/step-10.pt", "bytes": 2048}], now=2.0) == []
    (combined,) = ranks.apply(1, [{**reply, "path": "/r/rank1/checkpoints/step-10.pt", "bytes": 2048}], now=2.0)
    assert combined["ok"] is True
    assert combined["rank_steps"] == {"0": 9, "1": 9}
    state.apply(combined)
    assert state.pending == {}
    text = describe_action(state.take_answered()[0], "checkpoint")
    assert text == "2 ranks after step 9: checkpoint written: /r/rank0/checkpoints/step-10.pt (2.0 KiB, step 10)"

    # Another viewer's command: shown once, as the lead rank answered it; a reply of ours seen again (a replayed
    # stream) is not shown twice.
    theirs = {"kind": "action", "id": 99, "action": "dump", "ok": True, "step": 9, "path": "/d"}
    assert ranks.apply(0, [theirs], now=2.0) == [theirs]
    assert ranks.apply(1, [theirs], now=2.0) == []
    assert ranks.apply(0, [{**reply, "path": "/r/rank0/checkpoints/step-10.pt"}], now=2.0) == []

    # Not at one step, and a failure, are said as such.
    ranks.sent(8, "dump", [0, 1])
    ranks.apply(0, [{"kind": "action", "id": 8, "action": "dump", "ok": True, "step": 12, "path": "/d0"}], now=3.0)
    (apart,) = ranks.apply(1, [{"kind": "action", "id": 8, "ok": True, "step": 13, "path": "/d1"}], now=3.0)
    said = "2 ranks NOT at one step (rank 0 after step 12, rank 1 after step 13): dump written: /d0"
    assert describe_action(apart, "dump") == said
    ranks.sent(9, "pause", [0, 1])
    ranks.apply(0, [{"kind": "action", "id": 9, "action": "pause", "ok": True, "step": 14}], now=4.0)
    (failed,) = ranks.disconnected(1)
    assert failed["ok"] is False
    assert failed["error"] == "failed on rank 1: the rank went away before it answered"
    assert ranks.ranks[0].paused


def test_the_command_step_is_just_ahead_of_the_furthest_rank_by_the_records_in_flight():
    ranks = RanksState([0, 1], 2)
    assert ranks.command_step() is None
    ranks.apply(0, [step(n, wait=0.0, forward=0.002, backward=0.007) for n in range(5)], now=0.0)  # 10 ms steps
    ranks.apply(1, [step(n, wait=0.01) for n in range(7)], now=0.0)  # 18 ms steps
    assert ranks.command_step() == 7 + 100  # a second of the faster rank's steps past step 6
    slow = RanksState([0], 1)
    slow.apply(0, [step(0, forward=1.0, backward=1.0)], now=0.0)
    assert slow.command_step() == 1 + 2  # never fewer than two steps ahead


def test_at_travels_in_a_command_line_and_a_bad_one_is_refused():
    assert parse_command(command_line("checkpoint", 3, at=120)) == Command("checkpoint", 3, at=120)
    assert parse_command(command_line("dump", 4)) == Command("dump", 4)
    for bad in (b'{"cmd":"dump","id":1,"at":-1}', b'{"cmd":"dump","id":1,"at":"5"}', b'{"cmd":"dump","id":1,"at":1.5}'):
        with pytest.raises(ProtocolError, match="'at' must be a step count"):
            parse_command(bad)


def test_the_ranks_of_one_job_are_one_entry_and_a_run_of_one_stays_itself():
    def live(name: str, pid: int, run_id: str | None, rank: int | None, world: int | None) -> LiveRun:
        return LiveRun(name, pid, f"/s/{name}.{pid}.sock", 5, "live", run_id, None, rank, world)

    runs = [
        live("ddp", 11, "job-1", 1, 2),
        live("solo", 20, "r-9", 0, 1),
        live("ddp", 10, "job-1", 0, 2),
        live("ddp", 30, "job-2", 0, 2),  # another job of the same name
        live("ddp", 9, "job-1", 1, 2),  # a stale twin of rank 1: the newer pid is the rank
    ]
    grouped = group_jobs(runs)
    assert [type(g).__name__ for g in grouped] == ["LiveJob", "LiveRun", "LiveJob"]
    job = grouped[0]
    assert isinstance(job, LiveJob)
    assert [(r.rank, r.pid) for r in job.ranks] == [(0, 10), (1, 11)]
    assert (job.step, job.status, job.world_size) == (5, "live", 2)


def straggler_job(tmp_path: Path) -> Path:
    """A finished 2-rank job directory whose rank 1 waits 20 ms for its data at each of its 40 steps."""
    job = tmp_path / "ddp-job-1"
    for rank in (0, 1):
        records: list[dict[str, Any]] = [{**run(rank), "t": 1.0}]
        for n in range(40):
            # Rank 1 waits 20 ms for its data; rank 0 waits those 20 ms at the all-reduce, inside its backward.
            slow = step(n, wait=0.021, backward=0.004) if rank == 1 else step(n, wait=0.001, backward=0.024)
            records.append({**slow, "t": 1.0 + n})
        records.append({"kind": "end", "t": 50.0, "reason": "finished"})
        (job / f"rank{rank}").mkdir(parents=True)
        write_ledger(job / f"rank{rank}" / "ledger.jsonl", records)
    return job


async def test_replay_of_a_job_directory_shows_every_rank_and_the_straggler(tmp_path: Path):
    source = replay_source(str(straggler_job(tmp_path)))
    assert isinstance(source, RanksSource)
    assert not source.live
    app = RecordingApp(source, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, shown(app, "finished"), what="the replay to finish")
        await until(pilot, lambda: all(s.end_reason for s in app.ranks.ranks.values()) if app.ranks else False)
        await drawn(pilot)
        rows = plain(app.query_one(RanksPane)).splitlines()
        assert [r.split()[:2] + r.split()[4:5] for r in rows[1:3]] == [["0", "done", "39"], ["»1", "done", "39"]]
        header = app.query_one(HeaderBar).render().plain
        assert "ddp@h0  2 ranks  step 39" in header
        (alert,) = [a for a in app.state.alerts if a.rule == "straggler"]
        assert (alert.rank, alert.severity) == (1, "warning")
        assert "rank 1 makes the other ranks wait" in alert.message
        await pilot.press("c")
        assert app.state.pending == {}  # a replay sends nothing


async def test_replay_of_a_sharded_job_charts_the_models_grad_norm_and_says_so(tmp_path: Path):
    job = tmp_path / "fsdp-job-1"
    for rank, shard in ((0, 3.0), (1, 4.0)):
        records: list[dict[str, Any]] = [{**sharded(rank), "t": 1.0}]
        records += [{**step(n, **norms(shard * (n + 1))), "t": 1.0 + n} for n in range(20)]
        records.append({"kind": "end", "t": 30.0, "reason": "finished"})
        (job / f"rank{rank}").mkdir(parents=True)
        write_ledger(job / f"rank{rank}" / "ledger.jsonl", records)
    app = RecordingApp(replay_source(str(job)), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.step == 19, what="the lead's last step")
        await drawn(pilot)
        text = plain(app.query_one(TrainingPane))
        assert "grad norm, ranks' shards combined (log) 100" in text  # 5 x 20 at step 19; each shard 60 and 80
        assert [app.state.grad_norm.value_at(n) for n in (0, 9, 19)] == [5.0, 50.0, 100.0]


@pytest.mark.parametrize(
    ("size", "header", "rows"),
    [
        # The side column of a 60x20 terminal: the straggler's mark, each rank's state, wait and bwd+sync.
        ((60, 20), "#  state wait  sync", [" 0 done  1.0ms 24ms", "»1 done  21ms  4.0ms"]),
        (
            (120, 36),
            "#  state wait  sync  step   time  mem",
            [" 0 done  1.0ms 24ms  39     28ms  -", "»1 done  21ms  4.0ms 39     28ms  -"],
        ),
    ],
    ids=["60x20", "120x36"],
)
async def test_a_narrow_ranks_pane_keeps_the_columns_that_name_the_straggler(
    tmp_path: Path, size: tuple[int, int], header: str, rows: list[str]
):
    app = RecordingApp(replay_source(str(straggler_job(tmp_path))), clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: all(s.end_reason for s in app.ranks.ranks.values()) if app.ranks else False)
        await drawn(pilot)
        lines = [line.rstrip() for line in plain(app.query_one(RanksPane)).splitlines()]
        assert lines[:3] == [header, *rows]
        assert lines[3] == "» the others wait for it (straggler)"


def test_the_ranks_columns_fit_their_pane_and_a_wide_one_shows_every_column():
    for width in range(12, 90):
        columns = columns_for(width, rank_digits=2)
        assert sum(c.width for c in columns) - 1 <= width
    assert columns_for(67) == COLUMNS  # the whole table, full status names and ms to 0.1
    assert [c.title for c in columns_for(20)] == ["#", "state", "wait", "sync"]
    assert columns_for(20, rank_digits=3)[0].width == 5  # "»127" and a gap: one column less
    assert [c.title for c in columns_for(20, rank_digits=3)] == ["#", "state", "wait"]


async def test_the_metrics_view_of_a_job_has_its_ranks_data_wait_and_memory_a_line_each(tmp_path: Path):
    app = RecordingApp(replay_source(str(straggler_job(tmp_path))), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: all(s.end_reason for s in app.ranks.ranks.values()) if app.ranks else False)
        await pilot.press("m")
        await drawn(pilot)
        view = app.query_one(MetricsPane).view
        assert view is not None
        (waits,) = [c for c in view.cells if c.name == "data_wait_s by rank"]
        assert [line.role for line in waits.chart.lines] == ["rank-a", "rank-b"]
        assert app.ranks is not None
        assert {line.series.current for line in waits.chart.lines} == {0.001, 0.021}  # rank 0's and rank 1's
