"""The viewer app driven with Pilot: from a ledger file, and from a real training subprocess."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Group
from rich.text import Text

from tuiwatch.analysis.format import number
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.messages import SourceEnded, SourceProgress
from tuiwatch.viewer.panes.alerts import AlertsPane
from tuiwatch.viewer.panes.base import Pane
from tuiwatch.viewer.panes.header import HeaderBar
from tuiwatch.viewer.panes.memory import MemoryPane
from tuiwatch.viewer.panes.timing import TimingPane
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.screens.confirm_stop import ConfirmStop
from tuiwatch.viewer.screens.help import HelpScreen
from tuiwatch.viewer.sources import FileSource, SocketSource
from tuiwatch.wire.discovery import find_socket_by_name
from tuiwatch.wire.socketdir import list_sockets

from ..helpers import LOADED_MACHINE_S, finish, start_training, wait_until
from ..viewer_helpers import FIXED_NOW, RecordingApp, drawn, plain, shown, until, write_ledger

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


async def test_replay_shows_the_ledgers_values_on_every_pane():
    steps = [r for r in read_ledger(LEDGERS / "healthy.jsonl") if r["kind"] == "step"]
    last = steps[-1]
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"), what="the replay to finish")
        await drawn(pilot)
        header = app.query_one(HeaderBar).render().plain  # type: ignore[union-attr]
        assert "demo-mlp@gpu-box" in header
        assert "step 149" in header
        assert "finished" in header
        assert "[replay]" in header
        training = plain(app.query_one(TrainingPane))
        assert f"loss {number(last['loss'])}" in training
        assert f"grad norm pre-clip (log) {number(last['grad_norm'])}" in training
        assert "val_loss" in training
        assert "lr (log) 0.1" in training
        timing = plain(app.query_one(TimingPane))
        assert "ex/s" in timing
        assert "wait" in timing
        assert "cpu" in plain(app.query_one(MemoryPane))
        assert plain(app.query_one(AlertsPane)) == "no alerts"


async def test_a_run_whose_steps_have_no_lr_says_so_where_its_lr_chart_would_be(tmp_path: Path):
    # An optimizer whose param groups have no "lr" (a step size of its own) writes lr [null]: the chart said "(no
    # data yet)" to the end of the run, as if one were coming.
    records = [{**r, "lr": [None]} if r["kind"] == "step" else r for r in read_ledger(LEDGERS / "healthy.jsonl")]
    ledger = write_ledger(tmp_path / "ledger.jsonl", records)
    app = RecordingApp(FileSource(ledger), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"), what="the replay to finish")
        await drawn(pilot)
        training = plain(app.query_one(TrainingPane))
        assert "(no lr in the step records)" in training
        assert "(no data yet)" not in training
        last = [r for r in records if r["kind"] == "step"][-1]
        assert f"grad norm pre-clip (log) {number(last['grad_norm'])}" in training  # the other charts as ever


async def test_a_sharded_runs_grad_norm_is_titled_as_its_ranks_shard(tmp_path: Path):
    # FSDP: a rank measures its shard's gradients (docs/distributed.md); "pre-clip" of the model it is not.
    records = [{**r, "sharded": True} if r["kind"] == "run" else r for r in read_ledger(LEDGERS / "healthy.jsonl")]
    app = RecordingApp(FileSource(write_ledger(tmp_path / "ledger.jsonl", records)), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"), what="the replay to finish")
        await drawn(pilot)
        training = plain(app.query_one(TrainingPane))
        last = [r for r in records if r["kind"] == "step"][-1]
        assert f"grad norm of this rank's shard (log) {number(last['grad_norm'])}" in training
        assert "pre-clip" not in training


async def test_replay_shows_command_keys_disabled_and_sends_nothing():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, shown(app, "finished"))
        for key in ("c", "d", "p", "s"):
            await pilot.press(key)
        assert [app.check_action(a, ()) for a in ("checkpoint", "dump", "pause", "stop", "help")] == [
            None,
            None,
            None,
            None,
            True,
        ]
        assert not isinstance(app.screen, ConfirmStop)
        assert app.state.pending == {}


async def test_a_run_counted_per_optimizer_step_without_measured_wait_says_so(tmp_path: Path):
    records: list[dict[str, Any]] = [{"kind": "run", "t": 1.0, "name": "accum", "run_id": "x", "step_per": "optimizer"}]
    for step in range(5):
        records.append(
            {"kind": "step", "t": 2.0 + step, "step": step, "loss": 1.0 / (step + 1), "lr": [0.1], "micro_batches": 4}
            | {"data_wait_s": None, "compute_s": 0.25, "opt_step": step + 1}
        )
    path = write_ledger(tmp_path / "ledger.jsonl", records)
    app = RecordingApp(FileSource(path), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.step == 4)
        await drawn(pilot)
        assert "all optimizer steps" in plain(app.query_one(TrainingPane)).splitlines()[0]
        timing = plain(app.query_one(TimingPane)).splitlines()
        assert timing[0] == "wait not measured  compute 250.0ms"
        assert "step 250.0ms" in timing[1]


@pytest.mark.integration
async def test_stop_from_the_viewer_ends_the_run_with_reason_stopped(tmp_path: Path, socket_dir: Path):
    run = start_training(tmp_path, socket_dir, "--steps", "100000", "--step-sleep", "0.005")
    path = wait_until(lambda: next(iter(list_sockets(socket_dir)), None), what="socket").path
    app = RecordingApp(SocketSource(path, None))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: (app.state.step or 0) > 5, what="live steps")
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmStop)
        await pilot.press("y")
        await until(pilot, shown(app, "stopped"), what="the run to stop")
        assert any(a.message.startswith("stop requested; final checkpoint ") for a in app.state.alerts)
        assert app.check_action("checkpoint", ()) is None  # nothing to command any more
    finish(run)


async def test_a_pane_redraws_only_when_its_view_changed():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"), what="the replay to finish")
        await drawn(pilot)
        panes: list[Any] = [app.query_one(cls) for cls in (TrainingPane, TimingPane, MemoryPane, AlertsPane)]
        views = [pane.view for pane in panes]
        await drawn(pilot)  # the same state, the same clock: every view is equal to the one shown
        # An equal view is not even assigned (reactive), so nothing is refreshed.
        assert all(pane.view is view for pane, view in zip(panes, views, strict=True))
        app.state.apply({"kind": "step", "t": 2.0, "step": 10_000, "loss": 0.5, "data_wait_s": 0.5, "compute_s": 0.1})
        app.redraw(force=True)
        changed = [pane.view is not view for pane, view in zip(panes, views, strict=True)]
        # A CPU step changes the training and timing charts; no memory reading, no alert: those stay.
        assert changed == [True, True, False, False]


async def test_keys_change_the_window_full_screen_help_and_quit():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, shown(app, "finished"))
        training = app.query_one(TrainingPane)
        await pilot.press("w")
        await drawn(pilot)
        assert training.view is not None
        assert training.view.loss.window == 1000
        assert "last 1k" in plain(training)  # the long "last 1,000 steps" does not fit beside the values at 80 columns
        await pilot.press("w", "w")
        assert app.window_index == 0
        await pilot.press("tab")
        assert isinstance(app.focused, Pane)
        assert app.focused is not training
        await pilot.press("f")
        assert app.screen.maximized is app.focused
        await pilot.press("f")
        assert app.screen.maximized is None
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_code == 0


async def test_a_disconnected_run_without_end_record():
    app = RecordingApp(FileSource(LEDGERS / "killed.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, shown(app, "disconnected"), what="disconnected")


async def test_alerts_are_shown_newest_first_with_their_next_check():
    app = RecordingApp(FileSource(LEDGERS / "alerts.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "failed"))
        await drawn(pilot)
        lines = plain(app.query_one(AlertsPane)).splitlines()
        assert lines[0] == "crit    120 nonfinite: first at step 120, boundary=grad (loss finite, grad norm inf)"
        assert lines[1] == "  → fix that boundary; dump saved"
        assert lines[2] == "  dump:"
        assert lines[3] == "runs/demo-mlp-20261202-170000/dumps/120-nonfinite"  # alone on its line: copied whole
        assert lines[4].startswith("warn     60 loss-spike: loss 0.41 is 9.3 sd")
        header = app.query_one(HeaderBar).render().plain  # type: ignore[union-attr]
        assert "● stopped: nonfinite at step 120" in header  # not "finished"
        assert "▲ nonfinite@120 (+1)" in header


async def test_strings_from_a_run_are_shown_literally(tmp_path: Path):
    hostile = "[bold red]pwn[/]\x1b]52;c;aGVsbG8=\x07\x1b[2J"
    records = [
        {"kind": "run", "t": 1.0, "name": hostile, "run_id": "x", "host": "h"},
        {"kind": "step", "t": 2.0, "step": 0, hostile: 0.5, "lr": [0.1]},
        {"kind": "alert", "t": 2.0, "rule": "loss-spike", "severity": "warning", "step": 0, "message": hostile},
    ]
    path = write_ledger(tmp_path / "ledger.jsonl", records)
    app = RecordingApp(FileSource(path), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.step == 0)
        await drawn(pilot)
        shown = [plain(app.query_one(TrainingPane)), plain(app.query_one(AlertsPane))]
        shown.append(app.query_one(HeaderBar).render().plain)  # type: ignore[union-attr]
        for text in shown:
            assert "[bold red]pwn[/]" in text
            assert "\x1b" not in text
            assert "\x07" not in text
        svg = app.export_screenshot()  # what the terminal would be sent, as text
        assert "\x1b" not in svg
        assert "\x07" not in svg
        assert "red]pwn[/]" in svg  # the markup is printed, not applied (the SVG writes spaces as &#160;)


@pytest.mark.integration
async def test_live_run_status_goes_live_disconnected_live_finished(tmp_path: Path, socket_dir: Path):
    args = ("--name", "livetest", "--steps", "100000", "--step-sleep", "0.005", "--samples", "4096")
    first = start_training(tmp_path / "a", socket_dir, *args)
    path = wait_until(lambda: next(iter(list_sockets(socket_dir)), None), what="socket").path
    source = SocketSource(path, "livetest", lambda name, skip: find_socket_by_name(name, skip, socket_dir))
    app = RecordingApp(source)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.state.status == "live" and (app.state.step or 0) > 20, what="live steps")
        await drawn(pilot)
        header = app.query_one(HeaderBar).render().plain  # type: ignore[union-attr]
        shown_step = int(header.split("step ")[1].split()[0].replace(",", ""))
        assert 20 < shown_step <= (app.state.step or 0)

        await pilot.press("c")
        written = "checkpoint written: "
        await until(pilot, lambda: any(a.message.startswith(written) for a in app.state.alerts), what="the reply")
        assert app.state.pending == {}
        line = next(a.message for a in app.state.alerts if a.message.startswith(written))
        assert Path(line[len(written) :].split(" (")[0]).is_file()
        assert any(note.startswith(written) for note in app.notes)

        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        # Seen within about 0.1 s on an idle machine; a viewer that missed the end would wait forever.
        await until(pilot, shown(app, "disconnected"), timeout=LOADED_MACHINE_S, what="disconnected")

        os.unlink(path)  # a killed run leaves its socket file behind; the next run cleans up too
        second = start_training(
            tmp_path / "b", socket_dir, "--name", "livetest", "--steps", "300", "--step-sleep", "0.005"
        )
        await until(pilot, lambda: app.state.run.get("pid") == second.pid, what="reconnected to the restarted run")
        assert app.state.status in ("live", "finished")
        await until(pilot, shown(app, "finished"), what="the second run to finish")
        steps = [r["step"] for r in read_ledger(next((tmp_path / "b").glob("*/ledger.jsonl"))) if r["kind"] == "step"]
        assert app.state.step == steps[-1]
        assert app.state.metrics["loss"].count == len(steps)
        finish(second)


async def test_replay_of_a_resumed_run_shows_it_from_its_first_step(tmp_path: Path):
    def write(path: Path, records: list[dict[str, Any]]) -> Path:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        return path

    a = write(
        tmp_path / "a.jsonl",
        [{"kind": "run", "t": 1.0, "name": "lm", "run_id": "a"}]
        + [{"kind": "step", "t": 2.0 + s, "step": s, "loss": 9.0 - s} for s in range(8)],
    )
    link = {"checkpoint": "/runs/a/checkpoints/step-5.pt", "step": 5, "ledger": str(a), "run_id": "a"}
    b = write(
        tmp_path / "b.jsonl",
        [{"kind": "run", "t": 20.0, "name": "lm", "run_id": "b", "resumed_from": link}]
        + [{"kind": "step", "t": 21.0 + s, "step": s, "loss": 100.0 + s} for s in range(5, 9)],
    )
    app = RecordingApp(FileSource(b), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "disconnected"))  # no end record: a killed run
        loss = app.state.metrics["loss"]
        assert loss.count == 9  # steps 0-4 from the first ledger, 5-8 from the resumed one
        assert app.state.step == 8
        assert loss.current == 108.0
        assert app.state.run["run_id"] == "b"


@pytest.mark.parametrize("size", [(60, 20), (80, 24), (120, 36), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_alerts_pane_and_the_status_are_never_off_screen(size: tuple[int, int]):
    app = RecordingApp(FileSource(LEDGERS / "alerts.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, shown(app, "failed"))
        await drawn(pilot)
        alerts = app.query_one(AlertsPane)
        width, height = size
        assert alerts.region.bottom <= height - 1  # above the footer
        assert alerts.content_region.height >= 3
        assert plain(alerts).startswith("crit    120 nonfinite")
        header = app.query_one(HeaderBar).render().plain  # type: ignore[union-attr]
        assert "● stopped: nonfinite at step 120" in header
        assert len(header) <= width
        # q and ? survive in the footer at every width. Waited for: beside two CPU hogs the footer's keys were
        # once not yet on screen when the panes were.
        await until(pilot, lambda: "quit" in app.export_screenshot(), what="the footer's keys")
        assert "help" in app.export_screenshot()


@pytest.mark.parametrize("size", [(60, 20), (80, 24), (120, 36), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_keys_at_every_size_full_screen_gives_every_pane_the_whole_screen(size: tuple[int, int]):
    width, height = size
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, shown(app, "finished"))
        for pane_type in (TrainingPane, TimingPane, MemoryPane, AlertsPane):
            pane = app.query_one(pane_type)
            pane.focus()
            await pilot.press("f")
            await drawn(pilot)
            assert app.screen.maximized is pane
            assert pane.region.width == width, pane_type.__name__  # not wider than the screen, not narrower
            assert pane.region.height == height - 1, pane_type.__name__  # not timing's 8 rows: all but the footer
            await pilot.press("f")
            assert app.screen.maximized is None
        await pilot.press("w")
        await drawn(pilot)
        training = app.query_one(TrainingPane)
        assert training.view is not None
        assert training.view.loss.window == 1000
        assert "last 1" in plain(training).splitlines()[0]  # "last 1,000 steps", or "last 1k" where narrow
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_titles_show_the_last_steps_own_values_nan_included(tmp_path: Path):
    records = [
        {"kind": "run", "t": 1.0, "name": "r", "run_id": "x"},
        *({"kind": "step", "t": 2.0 + i, "step": i, "loss": 1.0 / (i + 1), "lr": [0.1], "grad_norm": 2.0,
           "grad_norm_clipped": False} for i in range(20)),
        {"kind": "step", "t": 30.0, "step": 20, "loss": "nan", "lr": [0.1], "grad_norm": "inf",
         "grad_norm_clipped": True},
    ]  # fmt: skip
    path = write_ledger(tmp_path / "ledger.jsonl", records)
    app = RecordingApp(FileSource(path), clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.step == 20)
        await drawn(pilot)
        pane = app.query_one(TrainingPane)
        rendered = pane.render()
        assert isinstance(rendered, Group)
        titles = [t for t in rendered.renderables if isinstance(t, Text) and "┤" not in t.plain]
        loss_title = next(t for t in titles if t.plain.startswith("loss "))
        grad_title = next(t for t in titles if t.plain.startswith("grad norm"))
        assert loss_title.plain.startswith("loss nan")  # not 0.05, the last finite loss
        assert grad_title.plain.endswith("inf clipped")  # the norm and the flag of one step
        critical = pane.style_of("critical")
        for title, value in ((loss_title, "nan"), (grad_title, "inf")):
            start = title.plain.index(value)
            assert any(s.start == start and s.style == critical for s in title.spans), title.plain


async def test_a_replay_says_replay_and_the_runs_own_duration():
    app = RecordingApp(FileSource(LEDGERS / "healthy.jsonl"), clock=lambda: FIXED_NOW + 10_000)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, shown(app, "finished"))
        await drawn(pilot)
        header = app.query_one(HeaderBar).render().plain  # type: ignore[union-attr]
        records = list(read_ledger(LEDGERS / "healthy.jsonl"))
        duration = int(records[-1]["t"] - records[0]["t"])
        assert f"  {duration}s  " in header  # the run's own clock, not the 10,000 s since
        assert "● finished" in header
        assert "[replay]" in header
        assert "live" not in header
        assert app.loading is None


def test_a_replay_reports_its_progress_and_opens_the_newest_run_of_a_directory(tmp_path: Path):
    older, newer = tmp_path / "a-run", tmp_path / "b-run"
    for run_dir, name in ((older, "healthy.jsonl"), (newer, "alerts.jsonl")):
        run_dir.mkdir()
        (run_dir / "ledger.jsonl").write_bytes((LEDGERS / name).read_bytes())
    os.utime(older / "ledger.jsonl", (1, 1))
    source = FileSource(tmp_path)
    assert source.path == newer / "ledger.jsonl"
    posted: list[Any] = []
    source._run(posted.append)  # on this thread: the messages in the order a replay posts them
    progress = [m.percent for m in posted if isinstance(m, SourceProgress)]
    assert progress[-1] == 100
    assert progress == sorted(progress)
    assert isinstance(posted[-1], SourceEnded)


class BrokenSource(FileSource):
    def start(self, post: Any) -> None:
        raise RuntimeError("a bug in a source")


def test_a_viewer_that_crashes_exits_non_zero():
    app = TuiwatchApp(BrokenSource(LEDGERS / "healthy.jsonl"))
    app.run = lambda *a, **k: TuiwatchApp.run(app, headless=True)  # type: ignore[method-assign]
    assert app.run_viewer() == 1  # the CLI exits 1, not 0, after Textual's traceback
