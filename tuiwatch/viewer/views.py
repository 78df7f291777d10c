"""Frozen per-pane views: what each pane shows, built from the RunState by one pure function each.

The app builds the views at each redraw and hands each pane its own; a pane
renders from its view alone and only when the view changed (views compare by
value, series by identity and point count). No pane reads a raw record: every
field is read here, through :mod:`tuiwatch.ledger.fields`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tuiwatch.ledger.fields import finite, integer, num
from tuiwatch.ledger.records import Record
from tuiwatch.viewer.baseline import Baseline
from tuiwatch.viewer.ranks import RanksState
from tuiwatch.viewer.render.chart import NO_DATA, window_span
from tuiwatch.viewer.render.series import Series
from tuiwatch.viewer.state import Alert, RunState

MAX_OTHER_METRICS = 6
# Steps came and none had an lr: an optimizer whose param groups have none (a step size of its own), or a loop
# without an optimizer that does not log(lr=...). Not "yet": none will come.
NO_LR = "(no lr in the step records)"
MIN_ZOOM_STEPS = 10  # zooming in stops at this many steps across


@dataclass(frozen=True)
class Line:
    """One series of a chart and the component class it is drawn with."""

    series: Series  # compared by identity: a new connection's series is another line
    points: int  # the series' point count when the view was made: more points, another chart
    role: str
    markers: bool = False  # drawn as points (evals), not a line

    @classmethod
    def of(cls, series: Series, role: str, markers: bool = False) -> Line:
        return cls(series, series.count, role, markers)


@dataclass(frozen=True)
class Chart:
    lines: tuple[Line, ...]
    window: int | None  # the last N steps, or None for the whole run
    log: bool = False
    unit: str = ""  # of the values: "" (a number), "s" (seconds), "B" (bytes)
    span: tuple[int, int] | None = None  # the step axis, where charts share one (the metrics view)
    smooth: float = 0.0  # the weight of the moving average drawn over the lines (e), 0: none
    clip: float = 0.0  # the fraction of highest and lowest values left off the value range (o), 0: none
    cursor: int | None = None  # the step the cursor is at (.), drawn as its column
    mark: int | None = None  # --compare: the step where the two runs part, a dotted line in the compare colour
    empty: str = NO_DATA  # what it says without a point to draw


@dataclass(frozen=True)
class Looks:
    """How the user asked the charts to be drawn (keys ``e`` ``y`` ``o`` ``+`` ``-`` ``←`` ``→`` ``.``)."""

    smooth: float = 0.0  # the moving average's weight over the loss and the metrics (e)
    log_y: bool = False  # the loss and the metrics on a log value axis (y)
    clip: float = 0.0  # the fraction of their highest and lowest values left off the range (o)
    zoom: tuple[int, int] | None = None  # the steps every chart shows (None: the window's)
    cursor: int | None = None  # the step every chart is read at (.)


@dataclass(frozen=True)
class HeaderView:
    name: str
    host: str | None
    step: int | None
    epoch: int | None
    elapsed_s: int | None  # whole seconds: the header changes once a second, not at every frame
    status: str
    mode: str  # "live" or "replay"
    end_reason: str | None = None  # the end record's reason (nonfinite, exception, killed, ...)
    loading: int | None = None  # a replay still being read: percent of the ledger read
    alert: Alert | None = None  # the newest warning or critical: shown even where the alerts pane is not
    alerts: int = 0  # warnings and criticals so far
    ranks: str | None = None  # a job: "2 ranks" (or "6 of 8 ranks" where only some are attached); the rest is rank 0's


@dataclass(frozen=True)
class TrainingView:
    train_name: str | None
    train_value: float | None
    eval_name: str | None
    eval_value: float | None
    loss: Chart
    lr_value: float | None
    lr: Chart
    grad_norm_value: float | None
    grad_norm_clipped: bool
    grad_norm: Chart
    others: tuple[tuple[str, float | None], ...]  # further user metrics and their current values
    step_unit: str = "steps"  # what the x axis counts: "optimizer steps" when micro-batches fold
    compared: str | None = None  # --compare: "vs NAME: parts at step 120 (loss)"
    at_step: int | None = None  # the cursor's step: the values are that step's (the record the cursor snaps to)
    lr_constant: bool = False  # one lr all along: its line says so, and its chart's rows go to the loss
    sharded: bool = False  # the run's norms are its rank's shard's (FSDP): the grad norm's title says so
    combined: bool = False  # ... unless the viewer has every rank: the model's, from the ranks' shards (ranks.py)


@dataclass(frozen=True)
class TimingView:
    data_wait_s: float | None
    compute_s: float | None
    examples_per_s: float | None
    chart: Chart
    at_step: int | None = None  # the cursor's record: the numbers are that step's

    @property
    def step_s(self) -> float | None:
        if self.compute_s is None:
            return None
        return (self.data_wait_s or 0.0) + self.compute_s  # a loop that measures no wait has none to add


@dataclass(frozen=True)
class DeviceMemoryView:
    """The CUDA allocator's counters of the last step, in bytes, and the device's total."""

    allocated: float
    reserved: float | None
    peak: float | None
    total: float | None
    device: str


@dataclass(frozen=True)
class GpuView:
    """One NVML reading."""

    index: str
    util_percent: float | None
    mem_used: float | None
    mem_total: float | None
    run_mem_used: float | None  # this run's own memory on that GPU
    temp_c: float | None
    power_w: float | None


@dataclass(frozen=True)
class MemoryView:
    device: DeviceMemoryView | None  # None when the run reports no device memory (CPU)
    gpus: tuple[GpuView, ...]
    gpu_error: str | None
    cpu_percent: float | None
    rss: float | None
    workers: int | None
    workers_cpu_percent: float | None
    chart_label: str
    chart: Chart
    at_step: int | None = None  # the cursor's record: what a step or a system record kept of that step


@dataclass(frozen=True)
class AlertsView:
    alerts: tuple[Alert, ...]  # newest first


# The alert pane's levels (keys 1, 2): the severities each shows; 3 shows every alert (an unknown severity too).
ALERT_LEVELS = {1: ("critical",), 2: ("critical", "warning")}


def shown_at(alert: Alert, level: int) -> bool:
    return level not in ALERT_LEVELS or alert.severity in ALERT_LEVELS[level]


@dataclass(frozen=True)
class AlertRow:
    """One row of the alert pane: an alert, or several of one rule in a row (the newest stands for them)."""

    alert: Alert
    steps: tuple[int | None, ...] = ()  # a group's steps, newest first; () for a single alert

    @property
    def count(self) -> int:
        return max(1, len(self.steps))


def alert_rows(alerts: tuple[Alert, ...], level: int = 3) -> tuple[AlertRow, ...]:
    """The alerts a level shows, newest first, with repeats of one rule next to each other as one row.

    A command's fate is shown at every level when it failed (critical), and
    with everything else at level 3. Rows of one rule, one severity and one
    rank in a row are one group: at level 2 a loss spike every few hundred
    steps, its "cleared" lines hidden, is one row that says how many.
    """
    kept = [a for a in alerts if shown_at(a, level)]
    rows: list[AlertRow] = []
    group: list[Alert] = []
    for alert in [*kept, None]:
        head = group[0] if group else None
        same = (
            head is not None
            and alert is not None
            and (alert.rule, alert.severity, alert.rank)
            == (
                head.rule,
                head.severity,
                head.rank,
            )
        )
        if same and alert is not None and alert.rule != "command":
            group.append(alert)
            continue
        if head is not None:
            rows.append(AlertRow(head, tuple(a.step for a in group) if len(group) > 1 else ()))
        group = [alert] if alert is not None else []
    return tuple(rows)


@dataclass(frozen=True)
class RankRow:
    rank: int
    host: str | None
    step: int | None
    step_s: float | None  # medians over the rank's last steps
    data_wait_s: float | None
    backward_s: float | None  # under DDP it holds the wait at the gradient sync
    memory: float | None
    status: str  # live, stale, gone, paused, connecting, finished, stopped, failed
    waited_for: bool  # the straggler rule names it: the others wait for it
    slowest: bool
    thinned: int = 0  # step records the relay left out: its rows and charts are of the others


@dataclass(frozen=True)
class RanksView:
    world_size: int
    rows: tuple[RankRow, ...]  # every rank of a small job; of a large one, those worth a look
    summary: str | None  # a large job: counts by status and the spread of steps, instead of a row per rank
    charted: tuple[int, ...] = ()  # the ranks drawn in the charts, in the order of RANK_ROLES
    wait: Chart | None = None  # each charted rank's data wait over steps
    memory: Chart | None = None  # and its memory (device allocated, else RSS)


@dataclass(frozen=True)
class MetricCell:
    """One chart of the metrics view: a metric's name, its current value and its chart."""

    name: str
    value: float | None
    chart: Chart
    constant: bool = False  # every line one value all along, the same: its title line says it, no chart


@dataclass(frozen=True)
class MetricsView:
    cells: tuple[MetricCell, ...]  # every metric the filter keeps, in order; the pane shows a page of them
    total: int  # metrics before the filter
    pattern: str  # the filter ("" = all)
    page: int  # asked for; the pane keeps it within the pages there are


MAX_RANK_ROWS = 8  # more ranks than this are summarised: a 64-rank job is not 64 rows in a side pane
RANK_ROLES = ("rank-a", "rank-b", "rank-c", "rank-d")  # a colour each: more lines than this are not told apart


@dataclass(frozen=True)
class Views:
    header: HeaderView
    training: TrainingView
    timing: TimingView
    memory: MemoryView
    alerts: AlertsView
    ranks: RanksView | None = None


def build_views(
    state: RunState,
    *,
    window: int | None,
    now: float | None,
    mode: str,
    loading: int | None = None,
    ranks: RanksState | None = None,
    looks: Looks = Looks(),
    baseline: Baseline | None = None,
) -> Views:
    """Every pane's view. ``looks.zoom`` replaces the window in every chart; ``looks.cursor`` is drawn in
    every chart and the training values are read there."""
    header = header_view(state, now, mode, loading)
    if ranks is not None:
        shown = len(ranks.ranks)
        of = f"{shown} ranks" if shown == ranks.world_size else f"{shown} of {ranks.world_size} ranks"
        header = dataclasses.replace(header, ranks=of)
    views = Views(
        header,
        training_view(state, window, looks, baseline),
        timing_view(state, window),
        memory_view(state, window),
        AlertsView(tuple(state.alerts)),
        ranks_view(ranks, now or 0.0, window) if ranks is not None else None,
    )
    zoom, cursor = looks.zoom, looks.cursor
    if cursor is not None:
        views = dataclasses.replace(
            views, timing=timing_at(views.timing, state, cursor), memory=memory_at(views.memory, state, cursor)
        )
    return zoomed(views, zoom, cursor) if zoom is not None or cursor is not None else views


def zoomed(views: Views, span: tuple[int, int] | None, cursor: int | None = None) -> Views:
    """The views with every chart of the training, timing and memory panes drawn over steps ``span`` (None:
    their window), with the cursor at step ``cursor``."""

    def at(c: Chart) -> Chart:
        return dataclasses.replace(c, span=span if span is not None else c.span, cursor=cursor)

    t = views.training
    return dataclasses.replace(
        views,
        training=dataclasses.replace(t, loss=at(t.loss), lr=at(t.lr), grad_norm=at(t.grad_norm)),
        timing=dataclasses.replace(views.timing, chart=at(views.timing.chart)),
        memory=dataclasses.replace(views.memory, chart=at(views.memory.chart)),
    )


def step_extent(state: RunState) -> tuple[int, int] | None:
    """The run's first and last step drawn in the training charts: what zooming moves within."""
    drawn = [state.lr, state.grad_norm, *state.metrics.values()]
    firsts = [f for s in drawn if (f := s.first_step) is not None]
    lasts = [e for s in drawn if (e := s.end_step) is not None]
    return (min(firsts), max(lasts)) if firsts and lasts else None


def cursor_moved(state: RunState, cursor: int, shown: tuple[int, int], forward: bool) -> int:
    """``←``/``→`` with the cursor: to the record about a column of the charts away (a sixtieth of the steps
    shown), and at least to the next record of the training line, so that a metric logged every 50 steps is
    not pressed through step by step; kept within the steps shown."""
    first, last = shown
    move = max(1, (last - first) // 60)
    target = cursor + move if forward else cursor - move
    train = train_metric(state)
    series = state.metrics[train] if train is not None else state.lr if state.lr.count else state.grad_norm
    here, there = series.at(cursor), series.at(target)
    if forward:
        if there is None or (here is not None and there[0] <= here[0]):
            following = series.after(cursor)
            target = following if following is not None else target
        else:
            target = there[0]
    elif there is not None and (here is None or there[0] < here[0]):
        target = there[0]
    elif here is not None:
        earlier = series.at(here[0] - 1)
        target = earlier[0] if earlier is not None else target
    return min(max(target, first), last)


def zoom_span(
    extent: tuple[int, int], current: tuple[int, int], factor: float, shift: float = 0.0
) -> tuple[int, int] | None:
    """``current`` scaled by ``factor`` about its middle and moved by ``shift`` of its width, kept within
    ``extent`` and at least MIN_ZOOM_STEPS wide; None when it covers the whole extent (back to following)."""
    first, last = extent
    width = max((current[1] - current[0]) * factor, MIN_ZOOM_STEPS - 1)
    middle = (current[0] + current[1]) / 2 + shift * (current[1] - current[0])
    if width >= (last - first) * 0.99:  # the whole run, give or take the steps halving rounded off
        return None
    lo = round(middle - width / 2)
    lo = min(max(lo, first), last - int(width))
    return lo, lo + int(width)


def ranks_view(ranks: RanksState, now: float, window: int | None = None) -> RanksView:
    """Each rank's row; a job of more than MAX_RANK_ROWS ranks gets a summary and the rows worth a look (not
    live, the one the others wait for, the slowest and the fastest)."""
    medians = {r: s.median("step_s") for r, s in ranks.ranks.items()}
    timed = [m for m in medians.values() if m is not None]
    typical = sorted(timed)[len(timed) // 2] if timed else None
    slowest = max((r for r in medians if medians[r] is not None), key=lambda r: medians[r] or 0.0, default=None)
    # "Slowest" only where it stands out: under DDP every rank's step takes the same time.
    if slowest is not None and typical is not None and (medians[slowest] or 0.0) <= 1.05 * typical:
        slowest = None
    rows = [
        RankRow(
            rank,
            s.host,
            s.step,
            medians[rank],
            s.median("data_wait_s"),
            s.median("backward_s"),
            s.memory,
            s.status(now),
            rank == ranks.waited_for,
            rank == slowest,
            s.thinned,
        )
        for rank, s in ranks.ranks.items()
    ]
    fastest = min((r for r in medians if medians[r] is not None), key=lambda r: medians[r] or 0.0, default=None)
    # The lines worth telling apart: the rank the others wait for, the slowest, the lead, the fastest.
    first = [ranks.waited_for, slowest, ranks.lead, fastest] if len(rows) > len(RANK_ROLES) else list(ranks.ranks)
    charted = tuple(dict.fromkeys(r for r in first if r is not None))[: len(RANK_ROLES)]
    drawn = [(ranks.ranks[r], role) for r, role in zip(charted, RANK_ROLES[: len(charted)], strict=True)]
    wait = Chart(tuple(Line.of(s.wait_series, role) for s, role in drawn), window, unit="s")
    memory = Chart(tuple(Line.of(s.memory_series, role) for s, role in drawn), window, unit="B")
    if len(rows) <= MAX_RANK_ROWS:
        return RanksView(ranks.world_size, tuple(rows), None, charted, wait, memory)
    picked = [r for r in rows if r.status != "live" or r.waited_for or r.slowest]
    picked += [r for r in rows if r.rank == fastest and r not in picked]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    steps = [r.step for r in rows if r.step is not None]
    spread = f"; steps {min(steps)}–{max(steps)}" if steps else ""
    timing = f"; median step {typical * 1000:.1f} ms" if typical is not None else ""
    summary = f"{len(rows)} ranks: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + spread + timing
    return RanksView(ranks.world_size, tuple(picked[: MAX_RANK_ROWS - 1]), summary, charted, wait, memory)


def header_view(state: RunState, now: float | None, mode: str, loading: int | None = None) -> HeaderView:
    # A replay's clock is the run's own: its first to its last record, never the time since it started.
    elapsed = state.elapsed(now if mode == "live" else None)
    host = state.run.get("host")
    serious = [a for a in state.alerts if a.severity in ("warning", "critical")]
    return HeaderView(
        state.name,
        str(host) if host else None,
        state.step,
        state.epoch,
        None if elapsed is None else int(elapsed),
        state.status,
        mode,
        state.end_reason,
        loading,
        headline(state.alerts),
        len(serious),
    )


def headline(alerts: Iterable[Alert]) -> Alert | None:
    """The alert the header names: a critical one still active, else a warning still active, else the newest
    warning or critical alert. Active: its rule's latest word on that rank (``alerts`` runs newest first) is not
    an ``info`` (an episode's "cleared"). A run broken at step 4 whose loss then froze is named by the break, not
    by the warning that followed it."""
    latest: set[tuple[str, int | None]] = set()
    active: dict[str, Alert] = {}
    newest: Alert | None = None
    for alert in alerts:
        key = (alert.rule, alert.rank)
        serious = alert.severity in ("warning", "critical")
        if key not in latest:
            latest.add(key)
            if serious:
                active.setdefault(alert.severity, alert)
        if serious and newest is None:
            newest = alert
    return active.get("critical") or active.get("warning") or newest


def train_metric(state: RunState) -> str | None:
    """The metric to chart as 'loss': ``loss`` if logged, else the first one."""
    if "loss" in state.metrics:
        return "loss"
    return next(iter(state.metrics), None)


def eval_metric(state: RunState) -> str | None:
    """The eval metric charted beside it: ``val_loss``, ``eval_loss``, ``loss``, else one named like a loss."""
    for name in ("val_loss", "eval_loss", "loss"):
        if name in state.eval_metrics:
            return name
    return next((n for n in state.eval_metrics if "loss" in n), None)


def latest(step: Record, key: str, series: Series) -> float | None:
    """A title's value: the last step's own (NaN and inf included: they are the news), else the series' last
    drawn point when that step did not log it (a metric logged every N steps)."""
    value = num(step.get(key))
    return value if value is not None else series.current


def training_view(
    state: RunState, window: int | None, looks: Looks = Looks(), baseline: Baseline | None = None
) -> TrainingView:
    """Smoothing, the log axis and clipping (``looks``) are for the loss chart: lr and grad norm are drawn in
    log already, and one step's norm is the news, not its average. ``baseline`` (``--compare``): the other
    run's loss, lr and grad norm in each chart, and where the two part."""
    train, evaluation = train_metric(state), eval_metric(state)
    step = state.last_step
    lr = step.get("lr")
    lr_value = num(lr[0]) if isinstance(lr, list) and lr else state.lr.current
    loss_lines = []
    if train is not None:
        loss_lines.append(Line.of(state.metrics[train], "train"))
    if evaluation is not None:
        loss_lines.append(Line.of(state.eval_metrics[evaluation], "eval", markers=True))
    others = [n for n in state.metrics if n != train][:MAX_OTHER_METRICS]
    lr_lines, grad_lines = [Line.of(state.lr, "lr")], [Line.of(state.grad_norm, "grad")]
    compared, mark = None, None
    if baseline is not None:
        b = baseline.state
        b_train = train if train is not None and train in b.metrics else train_metric(b)
        if b_train is not None:
            loss_lines.append(Line.of(b.metrics[b_train], "compare"))
        lr_lines.append(Line.of(b.lr, "compare"))
        grad_lines.append(Line.of(b.grad_norm, "compare"))
        compared = f"vs {baseline.label}: {baseline.parting.said()}"
        mark = baseline.parted
    view = TrainingView(
        train_name=train,
        train_value=latest(step, train, state.metrics[train]) if train is not None else None,
        eval_name=evaluation,
        eval_value=state.eval_metrics[evaluation].current if evaluation is not None else None,
        loss=Chart(tuple(loss_lines), window, log=looks.log_y, smooth=looks.smooth, clip=looks.clip, mark=mark),
        lr_value=lr_value,
        lr=Chart(tuple(lr_lines), window, log=True, mark=mark, empty=NO_LR if step and not state.lr.count else NO_DATA),
        # The norm and the clipped flag of one step: a step without a norm shows none, not an older one's.
        grad_norm_value=num(step.get("grad_norm")),
        grad_norm_clipped=step.get("grad_norm_clipped") is True,
        grad_norm=Chart(tuple(grad_lines), window, log=True, mark=mark),
        others=tuple((n, state.metrics[n].current) for n in others),
        step_unit="optimizer steps" if state.run.get("step_per") == "optimizer" else "steps",
        compared=compared,
        lr_constant=state.lr.constant,
        sharded=state.run.get("sharded") is True,
        combined=step.get("norms") == "job",
    )
    return view if looks.cursor is None else at_cursor(view, state, looks.cursor)


def at_cursor(view: TrainingView, state: RunState, cursor: int) -> TrainingView:
    """The training view's values read at the cursor: each series' record at or before it."""
    train = state.metrics.get(view.train_name) if view.train_name is not None else None
    point = train.at(cursor) if train is not None else state.grad_norm.at(cursor)
    evaluation = state.eval_metrics.get(view.eval_name) if view.eval_name is not None else None
    return dataclasses.replace(
        view,
        train_value=None if point is None or train is None else point[1],
        eval_value=evaluation.value_at(cursor) if evaluation is not None else None,
        lr_value=state.lr.value_at(cursor),
        grad_norm_value=state.grad_norm.value_at(cursor),
        grad_norm_clipped=False,
        at_step=cursor if point is None else point[0],
    )


def timing_view(state: RunState, window: int | None) -> TimingView:
    step = state.last_step
    return TimingView(
        finite(step.get("data_wait_s")),
        finite(step.get("compute_s")),
        finite(step.get("examples_per_s")),
        Chart((Line.of(state.compute, "compute"), Line.of(state.data_wait, "wait")), window, unit="s"),
    )


def timing_at(view: TimingView, state: RunState, cursor: int) -> TimingView:
    """The timing numbers of the record the cursor snaps to (its compute time's: every step record has one)."""
    point = state.compute.at(cursor)
    if point is None:
        return dataclasses.replace(view, data_wait_s=None, compute_s=None, examples_per_s=None, at_step=cursor)
    step = point[0]

    def own(series: Series) -> float | None:
        p = series.at(step)
        return p[1] if p is not None and p[0] == step else None  # another step's would not add up with this one's

    return dataclasses.replace(
        view, data_wait_s=own(state.data_wait), compute_s=point[1], examples_per_s=own(state.throughput), at_step=step
    )


def memory_at(view: MemoryView, state: RunState, cursor: int) -> MemoryView:
    """What the memory pane has of the cursor's step: the allocated bytes of its step record, the RSS and each
    GPU's utilisation and memory from the system record before it. The rest (reserved, peak, CPU, workers,
    temperature, power) is kept for the last step only and is not shown."""

    def value(series: Series | None) -> float | None:
        return series.value_at(cursor) if series is not None else None

    allocated = state.mem_allocated.at(cursor)
    device = view.device
    if device is not None:
        device = (
            None if allocated is None else dataclasses.replace(device, allocated=allocated[1], reserved=None, peak=None)
        )
    gpus = tuple(
        dataclasses.replace(
            g,
            util_percent=value(state.gpus.get(f"gpu{g.index} util")),
            mem_used=value(state.gpus.get(f"gpu{g.index} memory")),
            run_mem_used=None,
            temp_c=None,
            power_w=None,
        )
        for g in view.gpus
    )
    # The step the cursor snaps to: its step record's (on the CPU, with no allocated bytes, the timing's).
    snapped = allocated or state.compute.at(cursor)
    step = snapped[0] if snapped is not None else cursor
    return dataclasses.replace(
        view,
        device=device,
        gpus=gpus,
        cpu_percent=None,
        rss=state.rss.value_at(cursor),
        workers=None,
        workers_cpu_percent=None,
        at_step=step,
    )


def device_total(run: Mapping[str, Any], gpus: list[Any] | None) -> float | None:
    """The run's device memory: from the run record, else NVML's reading of that device."""
    total = finite(run.get("mem_total"))
    if total is not None and total > 0:
        return total
    device = run.get("device")
    if not gpus or not isinstance(device, str) or not device.startswith("cuda"):
        return None
    device = device if ":" in device else "cuda:0"
    reading = next(
        (finite(g.get("mem_total")) for g in gpus if isinstance(g, dict) and g.get("device") == device), None
    )
    return reading if reading is not None and reading > 0 else None


def gpu_view(gpu: Mapping[str, Any]) -> GpuView:
    return GpuView(
        str(gpu.get("index")),
        finite(gpu.get("util")),
        finite(gpu.get("mem_used")),
        finite(gpu.get("mem_total")),
        finite(gpu.get("process_mem_used")),
        finite(gpu.get("temp")),
        finite(gpu.get("power")),
    )


def memory_view(state: RunState, window: int | None) -> MemoryView:
    step, system = state.last_step, state.last_system
    gpus = system.get("gpus") if isinstance(system.get("gpus"), list) else None
    allocated = finite(step.get("mem_allocated"))
    device = None
    if allocated is not None:
        device = DeviceMemoryView(
            allocated,
            finite(step.get("mem_reserved")),
            finite(step.get("mem_peak")),
            device_total(state.run, gpus),
            str(state.run.get("device")),
        )
    worker_cpu = system.get("workers_cpu_percent")
    workers = integer(system.get("workers"))
    busy = sum(v for v in map(finite, worker_cpu) if v is not None) if isinstance(worker_cpu, list) else None
    on_device = state.mem_allocated.count > 0
    reason = system.get("gpu_error")
    return MemoryView(
        device=device,
        gpus=tuple(gpu_view(g) for g in gpus or [] if isinstance(g, dict)),
        gpu_error=str(reason) if reason else None,
        cpu_percent=finite(system.get("cpu_percent")),
        rss=finite(system.get("rss")),
        workers=workers,
        workers_cpu_percent=busy if workers else None,
        chart_label="allocated" if on_device else "rss",
        chart=Chart((Line.of(state.mem_allocated if on_device else state.rss, "memory"),), window, unit="B"),
    )


def matches(name: str, pattern: str) -> bool:
    """The metrics view's filter: a glob when it has ``*?[``, else a regular expression searched for
    (case-insensitive); text that is not a valid expression is looked for as it is."""
    if not pattern:
        return True
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name.lower(), pattern.lower())
    try:
        return re.search(pattern, name, re.IGNORECASE) is not None
    except re.error:
        return pattern.lower() in name.lower()


@dataclass(frozen=True)
class Named:
    """A series of a run under the name the metrics view gives it, and how it is drawn."""

    name: str
    series: Series
    role: str
    key: str | None = None  # the step record's field, when the series is one: its value at the last step
    log: bool = False
    unit: str = ""


def named_series(state: RunState) -> list[Named]:
    """Every numeric series of a run: its logged metrics, then evaluation's, then what tuiwatch measures."""
    named = [Named(name, series, "train", key=name) for name, series in state.metrics.items()]
    named += [Named(f"eval {name}", series, "eval") for name, series in state.eval_metrics.items()]
    named += [
        Named("lr", state.lr, "lr", log=True),
        Named("grad_norm", state.grad_norm, "grad", "grad_norm", log=True),
        Named("param_norm", state.param_norm, "grad", "param_norm"),
        Named("update_norm", state.update_norm, "grad", "update_norm", log=True),
        Named("update/param", state.update_ratio, "grad", log=True),
        Named("examples_per_s", state.throughput, "compute", "examples_per_s"),
        Named("data_wait_s", state.data_wait, "wait", "data_wait_s", unit="s"),
        Named("compute_s", state.compute, "compute", "compute_s", unit="s"),
        Named("mem_allocated", state.mem_allocated, "memory", "mem_allocated", unit="B"),
        Named("rss", state.rss, "memory", unit="B"),
    ]
    named += [Named(n, s, "memory", unit="B" if n.endswith("memory") else "") for n, s in state.gpus.items()]
    return [n for n in named if n.series.count]


def metrics_view(
    state: RunState,
    window: int | None,
    pattern: str = "",
    page: int = 0,
    looks: Looks = Looks(),
    baseline: Baseline | None = None,
    ranks: RanksView | None = None,
) -> MetricsView:
    """Every numeric series the run has, a chart each (:func:`named_series`); with ``baseline`` (``--compare``),
    that run's series of the same name drawn in the same chart, and the step where the runs part marked.

    The charts share one step axis (the run's steps, or the window's, the
    baseline's included), so a step is at the same column in every chart.
    ``smooth`` draws each line's moving average over it; ``log_y`` puts every
    chart on a log scale.
    """
    named = named_series(state)
    other = {n.name: n.series for n in named_series(baseline.state)} if baseline is not None else {}
    mark = baseline.parted if baseline is not None else None
    drawn = [n.series for n in named] + [other[n.name] for n in named if n.name in other]
    ends = [e for s in drawn if (e := s.end_step) is not None]
    firsts = [f for s in drawn if (f := s.first_step) is not None]
    smooth, log_y, clip, cursor = looks.smooth, looks.log_y, looks.clip, looks.cursor
    span = looks.zoom
    if span is None and ends and firsts:
        span = window_span(min(firsts), max(ends), window)
    cells = []
    for n in named:
        if not matches(n.name, pattern):
            continue
        lines = [Line.of(n.series, n.role, n.role == "eval")]
        if n.name in other:
            lines.append(Line.of(other[n.name], "compare", n.role == "eval"))
        # A step field's value at the last step (NaN included: it is the news), else the series' last; with the
        # cursor, the record it snaps to.
        value = latest(state.last_step, n.key, n.series) if n.key is not None else n.series.current
        if cursor is not None:
            value = n.series.value_at(cursor)
        chart = Chart(tuple(lines), window, n.log or log_y, n.unit, span, smooth, clip, cursor, mark)
        constant = all(line.series.constant for line in lines) and len({line.series.current for line in lines}) == 1
        cells.append(MetricCell(n.name, value, chart, constant))
    # A job: what differs between its ranks over steps, a line per rank (the ranks the ranks pane charts).
    by_rank = [("data_wait_s by rank", ranks.wait), ("memory by rank", ranks.memory)] if ranks is not None else []
    for name, per_rank in by_rank:
        if per_rank is not None and per_rank.lines and matches(name, pattern):
            chart = dataclasses.replace(
                per_rank, span=span, smooth=smooth, clip=clip, cursor=cursor, log=log_y, mark=mark
            )
            cells.append(MetricCell(name, None, chart))
    return MetricsView(tuple(cells), len(named) + len(by_rank), pattern, page)
