"""The viewer app: one source in, one RunState folded from it, a view per pane pushed down, keys that send commands."""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.filter import LineFilter
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Input

from tuiwatch.analysis.format import safe
from tuiwatch.ledger.fields import num
from tuiwatch.ledger.records import Record
from tuiwatch.viewer import DEFAULT_FPS, SMOOTHING, THEMES
from tuiwatch.viewer.baseline import Baseline
from tuiwatch.viewer.messages import (
    RecordsReceived,
    SourceConnected,
    SourceDisconnected,
    SourceEnded,
    SourceProgress,
    SourceUntrusted,
)
from tuiwatch.viewer.panes.alerts import AlertsPane
from tuiwatch.viewer.panes.base import WINDOWS, Pane, window_label
from tuiwatch.viewer.panes.header import HeaderBar
from tuiwatch.viewer.panes.memory import MemoryPane
from tuiwatch.viewer.panes.metrics import MetricsPane, layout
from tuiwatch.viewer.panes.ranks import RanksPane
from tuiwatch.viewer.panes.timing import TimingPane
from tuiwatch.viewer.panes.training import TrainingPane
from tuiwatch.viewer.ranks import RanksState
from tuiwatch.viewer.render.chart import window_span
from tuiwatch.viewer.run_info import run_info
from tuiwatch.viewer.screens.alert import AlertScreen
from tuiwatch.viewer.screens.confirm_stop import ConfirmStop
from tuiwatch.viewer.screens.help import QUIT, HelpScreen
from tuiwatch.viewer.screens.run_info import RunInfoScreen
from tuiwatch.viewer.sources import RanksSource, Source
from tuiwatch.viewer.state import ENDED, RunState, describe_action
from tuiwatch.viewer.views import Looks, MetricCell, build_views, cursor_moved, metrics_view, step_extent, zoom_span
from tuiwatch.viewer.widgets import AsciiFilter, FilterInput

COMPACT_BELOW_ROWS = 24  # a shorter terminal gets the compact side column (tuiwatch.tcss)
# With a ranks pane the memory pane needs this many rows more; a shorter terminal leaves it out (each rank's
# memory is in the ranks pane).
MEMORY_WITH_RANKS_ROWS = 34
READ_ONLY = "replay is read-only: commands need a live run (tuiwatch attach)"
APART_PAUSE = (
    "the ranks paused at different steps: resuming them now (the rank ahead would wait in a collective "
    "until the process group's timeout ended the job); press p again"
)
COMMAND_ACTIONS = ("checkpoint", "dump", "pause", "stop")
CLIP = 0.01  # o: the fraction of a chart's highest and of its lowest values left off its value range
# A critical alert rings the terminal bell when it is newer than this as it arrives: the alerts a viewer
# attaching late is sent from the run's history are not news.
BELL_RECENT_S = 30.0


class TuiwatchApp(App[None]):
    CSS_PATH = Path(__file__).with_name("tuiwatch.tcss")
    TITLE = "tuiwatch"
    ENABLE_COMMAND_PALETTE = False  # its ^p would take the footer's room, and it offers nothing of ours
    # The footer shows these in order and cuts the last at 60 or 80 columns: quit and help come first.
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("c", "checkpoint", "checkpoint"),
        Binding("d", "dump", "dump"),
        Binding("p", "pause", "pause"),
        Binding("s", "stop", "stop"),
        Binding("w", "window", "window"),
        Binding("f", "fullscreen", "full"),
        # In ?: the footer keeps its room for the commands.
        Binding("i", "info", "info", show=False),
        Binding("m", "metrics", "metrics", show=False),
        Binding("e", "smooth", "smoothing", show=False),
        Binding("y", "log_y", "log scale", show=False),
        Binding("o", "outliers", "outliers", show=False),
        Binding("plus,equals_sign", "zoom(0.5)", "zoom in", show=False),
        Binding("minus", "zoom(2)", "zoom out", show=False),
        Binding("left", "pan(-0.25)", "earlier steps", show=False),
        Binding("right", "pan(0.25)", "later steps", show=False),
        Binding("0", "unzoom", "all", show=False),
        Binding("full_stop", "cursor", "cursor", show=False),
        Binding("x", "save_screen", "screenshot", show=False),
        Binding("slash", "filter", "filter", show=False),
        Binding("right_square_bracket,pagedown", "page(1)", "next page", show=False),
        Binding("left_square_bracket,pageup", "page(-1)", "previous page", show=False),
    ]

    def __init__(
        self,
        source: Source,
        *,
        clock: Callable[[], float] = time.time,
        fps: float = DEFAULT_FPS,
        quit_does: str = QUIT,
        bell: bool = True,
        baseline: Baseline | None = None,
        theme: str = "dark",
        window: int | None = None,
        smoothing: float = 0.0,
    ):
        super().__init__()
        self.theme_name = theme  # dark, light, ansi or ascii (THEMES), set on mount
        self._ascii = AsciiFilter() if theme == "ascii" else None  # every line drawn made ASCII
        self.baseline = baseline  # --compare: another run drawn beside this one
        self.bell_on = bell
        self._rung: set[tuple[object, ...]] = set()  # the critical alerts rung for, across reconnects
        self.quit_does = quit_does  # what q does, as help says it: the demo's q also ends its own training
        self.source = source
        self.clock = clock
        self.refresh_s = 1.0 / fps
        self.loading: int | None = None  # a replay's ledger still being read: percent
        self.state = RunState()
        self.window_index = WINDOWS.index(window) if window in WINDOWS else 0
        self._dirty = True
        self._last_draw = 0.0
        self._new_connection = False
        # Ids start at a random point: the run refuses an id it has seen, and
        # several viewers (or one that reconnects) share one run.
        self._ids = itertools.count(secrets.randbits(40) + 1)
        self._commands_enabled: bool | None = None
        self.mode = "live" if source.live else "replay"
        # A job of several ranks: every rank folded beside the lead rank's RunState (the ranks pane).
        self.ranks = RanksState(source.ranks, source.world_size) if isinstance(source, RanksSource) else None
        self._fresh_ranks: set[int] = set()  # ranks (re)connected whose first records have not come yet
        self._read: dict[int, int] = {}  # a job's replay: percent of each rank's ledger read
        # The metrics view (m): shown or not, its filter, its page, and its charts at the last draw.
        self.metrics_shown = False
        self.metrics_pattern = ""
        self.metrics_page = 0
        self._metrics_cells: tuple[MetricCell, ...] = ()
        self._pattern_before = ""  # the filter before / was pressed: what escape gives back
        # e and y: the moving average drawn over the loss (and the metrics view's lines), a log value axis.
        self.smoothing_index = SMOOTHING.index(smoothing) if smoothing in SMOOTHING else 0
        self.log_y = False
        self.clip = False  # o: the loss's (and the metrics') highest and lowest 1% left off the value range
        self.zoom: tuple[int, int] | None = None  # + - ← →: the steps every chart shows (None: follow the window)
        self.cursor: int | None = None  # .: the step whose values every chart shows (← → move it)

    def get_line_filters(self) -> Sequence[LineFilter]:
        filters = super().get_line_filters()
        return filters if self._ascii is None else [*filters, self._ascii]

    def run_viewer(self) -> int:
        """Run the app; the exit code for the CLI: non-zero when the app crashed (Textual prints why)."""
        self.run()
        return self.return_code or 0

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with Horizontal(id="body"):
            yield TrainingPane()
            with Vertical(id="side"):
                yield TimingPane()
                yield MemoryPane()
                yield RanksPane()
                yield AlertsPane()
            yield MetricsPane()
        yield FilterInput(placeholder="metrics named (glob or regex): enter keeps, esc cancels", id="filter")
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        self._fit_layout()

    def _fit_layout(self) -> None:
        try:
            body = self.query_one("#body")
        except NoMatches:
            return
        body.set_class(self.size.height < COMPACT_BELOW_ROWS, "compact")
        body.set_class(self.ranks is not None, "ranks")
        body.set_class(self.ranks is not None and self.size.height < MEMORY_WITH_RANKS_ROWS, "no-memory")

    def on_mount(self) -> None:
        self.theme = THEMES.get(self.theme_name, THEMES["dark"])
        self._fit_layout()
        self.query_one(TrainingPane).focus()
        self._ticker = self.set_interval(self.refresh_s, self.redraw)
        self.source.start(self.post_message)
        self.redraw(force=True)

    def on_unmount(self) -> None:
        self.source.stop()

    # --- records in ----------------------------------------------------------------

    def on_records_received(self, message: RecordsReceived) -> None:
        if self.ranks is not None and message.rank is not None:
            self._rank_records(message.rank, message.records)
            return
        if self._new_connection:
            # Every connection replays the run from its first record: start clean,
            # so nothing is counted twice across a reconnect. Only once records
            # come: a connection that dies empty must not wipe what is shown. Commands
            # still in flight stay: their replies come on the new connection.
            self.state = RunState(pending=self.state.pending)
            self._new_connection = False
            if self.baseline is not None:
                self.baseline.parting.reset()
        self.state.apply_all(message.records)
        self._compare(message.records)
        self._ring_for(message.records)
        self._changed()
        self._tell_answers()

    def _rank_records(self, rank: int, records: list[Record]) -> None:
        assert self.ranks is not None
        if rank in self._fresh_ranks:
            self._fresh_ranks.discard(rank)
            self.ranks.connected(rank)
            if rank == self.ranks.lead:
                # The lead rank's stream starts over: the run's state too, with the other ranks' alerts kept.
                self.state = RunState(pending=self.state.pending)
                self.state.apply_all(self.ranks.kept_alerts())
                if self.baseline is not None:
                    self.baseline.parting.reset()
        main = self.ranks.apply(rank, records, self.clock())
        self.state.apply_all(main)
        self._compare(main)
        self._ring_for(main)
        self._changed()
        self._tell_answers()

    def _compare(self, records: list[Record]) -> None:
        if self.baseline is not None:
            for record in records:
                self.baseline.parting.feed(record)

    def _ring_for(self, records: list[Record]) -> None:
        """The terminal bell for a critical alert that just happened in a live run (tmux and most terminals
        turn it into a notification for a user looking at another window): once per alert, once per batch."""
        if not self.bell_on or not self.source.live:
            return
        now = self.clock()
        for r in records:
            if r.get("kind") != "alert" or r.get("severity") != "critical":
                continue
            t = num(r.get("t"))
            key = (r.get("rule"), r.get("step"), r.get("rank"), t)
            if t is not None and now - t < BELL_RECENT_S and key not in self._rung:
                self._rung.add(key)
                self.bell()
                return

    def _tell_answers(self) -> None:
        for r in self.state.take_answered():
            text = describe_action(r, str(r.get("action")))
            severity: SeverityLevel = "error" if not r.get("ok") else "warning" if r.get("apart") else "information"
            self.notify(safe(text), severity=severity, markup=False)
            if r.get("action") == "pause" and r.get("ok") and r.get("apart"):
                # The rank ahead would wait inside the next collective for the others until the process group's
                # timeout ended the job: a pause that is not at one step is undone at once.
                self.notify(APART_PAUSE, severity="warning", markup=False, timeout=15)
                self._send("resume")

    def on_source_connected(self, message: SourceConnected) -> None:
        if self.ranks is not None and message.rank is not None:
            self._fresh_ranks.add(message.rank)  # its row starts over when its first records come
            self.ranks.ranks[message.rank].connected = True
            return
        self._new_connection = True

    def on_source_disconnected(self, message: SourceDisconnected) -> None:
        if self.ranks is not None and message.rank is not None:
            rank = self.ranks.ranks[message.rank]
            ended = rank.end_reason is not None
            self.state.apply_all(self.ranks.disconnected(message.rank))
            self._tell_answers()
            if message.rank == self.ranks.lead:
                self.state.disconnected()
            self._changed()
            if not ended:
                reason = safe(f"rank {message.rank}: {message.reason}")
                self.notify(reason, title="disconnected", severity="warning", markup=False)
            return
        was = self.state.status
        self.state.disconnected()
        self._changed()
        if was not in ENDED:
            self.notify(safe(message.reason), title="disconnected", severity="warning", markup=False)

    def on_source_untrusted(self, message: SourceUntrusted) -> None:
        # Said even after the run ended: the viewer is being offered a stream that is not the run's.
        self.notify(safe(message.reason), title="not trusted", severity="error", markup=False, timeout=30)

    def on_source_ended(self, message: SourceEnded) -> None:
        if self.ranks is not None and message.rank is not None:
            self.state.apply_all(self.ranks.disconnected(message.rank))  # a rank's ledger read to its end
            self._read[message.rank] = 100
            if message.rank != self.ranks.lead:
                self._changed()
                return
        if self.state.live:
            self.state.disconnected()  # the ledger ends without an end record: the run died
        self.loading = None
        self._changed()

    def on_source_progress(self, message: SourceProgress) -> None:
        if self.ranks is not None and message.rank is not None:
            # A job's replay is loading until every rank's ledger is read.
            self._read[message.rank] = message.percent
            percent = min(self._read.get(rank, 0) for rank in self.ranks.ranks)
        else:
            percent = message.percent
        self.loading = percent if percent < 100 else None
        self._changed()

    def _changed(self) -> None:
        """Something to draw: the next tick draws it (the ticker sleeps once a run has ended; a followed
        ledger or a reconnect brings records after the end)."""
        self._dirty = True
        self._ticker.resume()

    def redraw(self, force: bool = False) -> None:
        """Push a view down to each pane (at most ``fps`` times a second; once a second for a live run's clock).

        A pane whose view is equal to the one it has does not redraw.
        """
        now = self.clock()
        # A live run's clock ticks once a second; an ended run or a replay draws only when something changed.
        ticking = self.mode == "live" and self.state.live and int(now) != int(self._last_draw)
        if not (self._dirty or force or ticking):
            if not self.state.live and self.loading is None:
                self._ticker.pause()  # an ended run: nothing periodic until a record or a key
            return
        try:
            header = self.query_one(HeaderBar)
        except NoMatches:
            return  # the timer fired while the screen is torn down at exit
        self._dirty = False
        self._last_draw = now
        views = build_views(
            self.state,
            window=WINDOWS[self.window_index],
            now=now,
            mode=self.mode,
            loading=self.loading,
            ranks=self.ranks,
            looks=self.looks(),
            baseline=self.baseline,
        )
        header.view = views.header
        self.query_one(TrainingPane).view = views.training
        self.query_one(TimingPane).view = views.timing
        self.query_one(MemoryPane).view = views.memory
        self.query_one(AlertsPane).view = views.alerts
        if views.ranks is not None:
            self.query_one(RanksPane).view = views.ranks
        if self.metrics_shown:
            metrics = metrics_view(
                self.state,
                WINDOWS[self.window_index],
                self.metrics_pattern,
                self.metrics_page,
                self.looks(),
                self.baseline,
                views.ranks,
            )
            self._metrics_cells = metrics.cells
            self.query_one(MetricsPane).view = metrics
        available = self._commands_available()
        if available != self._commands_enabled:
            self._commands_enabled = available
            self.refresh_bindings()

    # --- keys ----------------------------------------------------------------------

    def _send(self, cmd: str) -> None:
        if not self.source.live:
            self.notify(READ_ONLY, severity="warning", markup=False)
            return
        cmd_id = next(self._ids)
        if isinstance(self.source, RanksSource) and self.ranks is not None:
            self._send_to_ranks(self.source, self.ranks, cmd, cmd_id)
            return
        if not self.source.send(cmd, cmd_id):
            self.notify(f"{cmd}: not sent, the run is not connected", severity="error", markup=False)
            return
        self.state.command_sent(cmd_id, cmd)
        self.notify(f"{cmd} sent", markup=False)
        self._dirty = True

    def _send_to_ranks(self, source: RanksSource, ranks: RanksState, cmd: str, cmd_id: int) -> None:
        """Every live rank runs the command at one step: just ahead of the furthest rank. A paused job is
        resumed, checkpointed or stopped where it stands (every rank paused at one step)."""
        at = None if self.state.status == "paused" or cmd == "resume" else ranks.command_step()
        took = [r for r in ranks.live_ranks() if source.send_to(r, cmd, cmd_id, at)]
        if not took:
            self.notify(f"{cmd}: not sent, no rank is connected", severity="error", markup=False)
            return
        ranks.sent(cmd_id, cmd, took)
        where = f"after step {at - 1}" if at is not None else "now"
        self.state.command_sent(cmd_id, cmd, f"{cmd} sent to {len(took)} of {ranks.world_size} ranks, {where}")
        self.notify(f"{cmd} sent to {len(took)} ranks", markup=False)
        self._dirty = True

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Command keys show greyed out where they cannot work: a replay, or a run that has ended."""
        if action in COMMAND_ACTIONS:
            return True if self._commands_available() else None
        if action in ("filter", "page"):
            return self.metrics_shown  # keys of the metrics view only
        return True

    def _commands_available(self) -> bool:
        return self.source.live and self.state.live

    def action_checkpoint(self) -> None:
        self._send("checkpoint")

    def action_dump(self) -> None:
        self._send("dump")

    def action_pause(self) -> None:
        self._send("resume" if self.state.status == "paused" else "pause")

    def action_stop(self) -> None:
        if not self.source.live:
            self.notify(READ_ONLY, severity="warning", markup=False)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._send("stop")

        self.push_screen(ConfirmStop(self.state.name), answered)

    def action_window(self) -> None:
        self.window_index = (self.window_index + 1) % len(WINDOWS)
        self.notify(f"charts: {window_label(WINDOWS[self.window_index])}", timeout=1.5, markup=False)
        self.redraw(force=True)

    def looks(self) -> Looks:
        return Looks(SMOOTHING[self.smoothing_index], self.log_y, CLIP if self.clip else 0.0, self.zoom, self.cursor)

    def action_smooth(self) -> None:
        self.smoothing_index = (self.smoothing_index + 1) % len(SMOOTHING)
        weight = SMOOTHING[self.smoothing_index]
        said = f"smoothing: moving average, weight {weight:g}" if weight else "smoothing: off"
        self.notify(said, timeout=1.5, markup=False)
        self.redraw(force=True)

    def action_log_y(self) -> None:
        self.log_y = not self.log_y
        self.notify(f"loss (and metrics) value axis: {'log' if self.log_y else 'linear'}", timeout=1.5, markup=False)
        self.redraw(force=True)

    def action_zoom(self, factor: float) -> None:
        """+ and - (and the mouse wheel): half or twice the steps shown, about their middle."""
        extent = step_extent(self.state)
        if extent is None:
            return
        self.zoom = zoom_span(extent, self._shown(extent), factor)
        self.redraw(force=True)

    def _shown(self, extent: tuple[int, int]) -> tuple[int, int]:
        """The steps the charts show: the zoom, else the window's last steps of the run."""
        window = WINDOWS[self.window_index]
        return self.zoom or window_span(*extent, window)

    def action_cursor(self) -> None:
        """.: a cursor in the middle of the steps shown, or none; ← → then move it."""
        extent = step_extent(self.state)
        if self.cursor is not None or extent is None:
            self.cursor = None
        else:
            first, last = self._shown(extent)
            self.cursor = (first + last) // 2
        self.redraw(force=True)

    def action_pan(self, shift: float) -> None:
        """← and →: a quarter of the steps shown earlier or later (zoomed in; the window follows the run); with
        the cursor, the cursor to a record about a column away (:func:`cursor_moved`)."""
        extent = step_extent(self.state)
        if extent is None:
            return
        if self.cursor is not None:
            self.cursor = cursor_moved(self.state, self.cursor, self._shown(extent), shift > 0)
            self.redraw(force=True)
            return
        if self.zoom is None:
            return
        self.zoom = zoom_span(extent, self.zoom, 1.0, shift)
        self.redraw(force=True)

    def action_unzoom(self) -> None:
        self.zoom = None
        self.redraw(force=True)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        if len(self.screen_stack) == 1:  # not under a dialog (which scrolls its own text)
            self.action_zoom(0.5)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        if len(self.screen_stack) == 1:
            self.action_zoom(2.0)

    def action_outliers(self) -> None:
        self.clip = not self.clip
        said = (
            f"value range: the top and bottom {CLIP:.0%} left off (↑ ↓ mark them)" if self.clip else "value range: all"
        )
        self.notify(said, timeout=1.5, markup=False)
        self.redraw(force=True)

    def action_save_screen(self) -> None:
        """x: the screen as an SVG, in the run directory where this host has it, else in the current directory."""
        run_dir = str(self.state.run.get("run_dir") or "")
        where = Path(run_dir) if run_dir and os.path.isdir(run_dir) and os.access(run_dir, os.W_OK) else Path.cwd()
        step = "-" if self.state.step is None else self.state.step
        name = f"screen-step{step}.svg"
        for n in itertools.count(2):
            if not (where / name).exists():
                break
            name = f"screen-step{step}-{n}.svg"
        try:
            path = self.save_screenshot(name, str(where))
        except OSError as exc:
            self.notify(safe(f"screenshot not saved: {exc}"), severity="error", markup=False)
            return
        self.notify(safe(f"screenshot: {path}"), timeout=6, markup=False)

    def action_fullscreen(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
            return
        focused = self.focused
        pane = focused if isinstance(focused, Pane) else self.query_one(TrainingPane)
        self.screen.maximize(pane)

    def action_metrics(self) -> None:
        """m: every metric as a grid of charts in place of the panes, and back."""
        self.metrics_shown = not self.metrics_shown
        self.metrics_page = 0
        self.query_one("#body").set_class(self.metrics_shown, "metrics")
        self.query_one(MetricsPane if self.metrics_shown else TrainingPane).focus()
        self.refresh_bindings()
        self.redraw(force=True)

    def action_filter(self) -> None:
        field = self.query_one(FilterInput)
        self._pattern_before = self.metrics_pattern
        field.value = self.metrics_pattern
        field.display = True
        field.focus()

    def action_page(self, delta: int) -> None:
        pane = self.query_one(MetricsPane)
        count = len(layout(self._metrics_cells, pane.content_region.width, pane.content_region.height))
        self.metrics_page = min(max(self.metrics_page + delta, 0), count - 1)
        self.redraw(force=True)

    def on_input_changed(self, event: Input.Changed) -> None:
        # The grid follows the filter as it is typed (as LEET's does).
        self.metrics_pattern = event.value.strip()
        self.metrics_page = 0
        self.redraw(force=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_filter()

    def on_filter_input_cancelled(self, event: FilterInput.Cancelled) -> None:
        self.metrics_pattern = self._pattern_before
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one(FilterInput).display = False
        self.query_one(MetricsPane).focus()
        self.redraw(force=True)

    def on_pane_step_clicked(self, message: Pane.StepClicked) -> None:
        self.cursor = message.step
        self.redraw(force=True)

    def on_alerts_pane_chosen(self, message: AlertsPane.Chosen) -> None:
        """enter on an alert: the cursor goes to its step (every chart's values there) and the alert opens."""
        step = message.row.alert.step
        if step is not None and message.row.alert.rule != "command":
            self.cursor = step
            extent = step_extent(self.state)
            if self.zoom is not None and extent is not None and not self.zoom[0] <= step <= self.zoom[1]:
                half = (self.zoom[1] - self.zoom[0]) // 2  # zoomed elsewhere: the same width, about the alert
                self.zoom = zoom_span(extent, (step - half, step + half), 1.0)
            self.redraw(force=True)
        self.push_screen(AlertScreen(message.row))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.quit_does))

    def action_info(self) -> None:
        self.push_screen(RunInfoScreen(run_info(self.state.run, self.state.last_system)))
