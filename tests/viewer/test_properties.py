"""Properties over random ledgers: the viewer's fold and drawing never fail, never overflow, never show stale values."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.style import Style

from tuiwatch.ledger.fields import num
from tuiwatch.viewer.render.chart import LABEL_WIDTH, Trace, chart
from tuiwatch.viewer.state import RunState
from tuiwatch.viewer.views import Looks, build_views, step_extent, zoom_span

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(min_value=-1e30, max_value=1e30),
    st.sampled_from([0.0, 1e-12, 9.22e19, -3.5e-7, 1e30]),
)


@st.composite
def ledgers(draw: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [{"kind": "run", "t": 0.0, "name": "p", "run_id": "x"}]
    step = draw(st.integers(0, 10**6))
    for i in range(draw(st.integers(1, 60))):
        step += draw(st.integers(1, 5000))
        record: dict[str, Any] = {"kind": "step", "t": float(i), "step": step}
        if draw(st.booleans()):
            record["loss"] = draw(VALUES)
        if draw(st.booleans()):
            record["grad_norm"] = draw(VALUES)
            record["grad_norm_clipped"] = draw(st.booleans())
        if draw(st.booleans()):
            record["lr"] = [draw(VALUES)]
        for key in ("data_wait_s", "compute_s", "mem_allocated"):
            if draw(st.booleans()):
                record[key] = draw(VALUES)
        records.append(record)
        if draw(st.integers(0, 9)) == 0:
            records.append({"kind": "eval", "t": float(i), "step": step, "val_loss": draw(VALUES)})
    return records


def same(a: float | None, b: float | None) -> bool:
    return a is b or (a is not None and b is not None and (a == b or (math.isnan(a) and math.isnan(b))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(), st.integers(11, 160), st.integers(1, 30), st.sampled_from([None, 1000, 100]))
def test_any_ledger_draws_within_its_cells_with_the_last_steps_values(
    records: list[dict[str, Any]], width: int, height: int, window: int | None
) -> None:
    state = RunState()
    state.apply_all(records)
    views = build_views(state, window=window, now=None, mode="replay")
    last = [r for r in records if r["kind"] == "step"][-1]
    # Every title value is the last step's own (NaN and inf included), or the series' last point when it
    # did not log that field.
    if "loss" in last:
        assert same(views.training.train_value, num(last["loss"]))
    assert same(views.training.grad_norm_value, num(last.get("grad_norm")))
    assert views.training.grad_norm_clipped is (last.get("grad_norm_clipped") is True)
    for c in (views.training.loss, views.training.lr, views.training.grad_norm, views.timing.chart, views.memory.chart):
        traces = [Trace(line.series, Style(), line.markers) for line in c.lines]
        rows = chart(traces, width, height, c.window, c.log, c.unit)
        assert len(rows) in (0, height)
        for row in rows:
            assert row.cell_len <= width
            label = row.plain[:LABEL_WIDTH]
            if "┤" in label:
                assert label.endswith("┤")  # the label fits its gutter: never cut, never pushed into the chart
                assert "…" not in label


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ledgers(),
    st.integers(11, 120),
    st.integers(1, 12),
    st.sampled_from([0.0, 0.6, 0.9, 0.99]),
    st.booleans(),
    st.sampled_from([0.0, 0.01]),
    st.integers(0, 10**6 + 400_000),
    st.floats(0.05, 4.0),
)
def test_smoothing_log_clipping_zoom_and_a_cursor_draw_any_ledger_and_the_cursor_reads_its_record(
    records: list[dict[str, Any]],
    width: int,
    height: int,
    smooth: float,
    log_y: bool,
    clip: float,
    cursor: int,
    factor: float,
) -> None:
    state = RunState()
    state.apply_all(records)
    extent = step_extent(state)
    zoom = zoom_span(extent, extent, factor) if extent is not None else None
    looks = Looks(smooth, log_y, clip, zoom, cursor)
    views = build_views(state, window=None, now=None, mode="replay", looks=looks)
    for c in (views.training.loss, views.training.lr, views.training.grad_norm, views.timing.chart):
        traces = [Trace(line.series, Style(), line.markers, c.smooth) for line in c.lines]
        rows = chart(traces, width, height, c.window, c.log, c.unit, c.span, c.clip, c.cursor)
        assert len(rows) in (0, height)
        assert all(row.cell_len <= width for row in rows)
    # The cursor reads the loss record at or before its step: exactly the ledger's (the series keeps them all here).
    steps = {r["step"]: num(r["loss"]) for r in records if r["kind"] == "step" and num(r.get("loss")) is not None}
    finite = {s: v for s, v in steps.items() if v is not None and math.isfinite(v)}
    before = [s for s in finite if s <= cursor]
    if views.training.train_name == "loss" and finite:
        expected = finite[max(before)] if before else None
        assert same(views.training.train_value, expected)
