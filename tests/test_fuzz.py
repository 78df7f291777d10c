"""Fuzzing with hypothesis: what a peer, a ledger or a run can send never crashes the parsers, rules or viewer state."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuiwatch.analysis.report import as_text, summarize
from tuiwatch.ledger.codec import DecodeError, decode
from tuiwatch.ledger.records import KINDS
from tuiwatch.rules import Diagnosis
from tuiwatch.viewer.panes.memory import bar, cpu_line, gpu_line
from tuiwatch.viewer.state import MAX_ALERTS, MAX_METRICS, RunState
from tuiwatch.viewer.views import device_total, gpu_view, memory_view
from tuiwatch.wire.protocol import MAX_LINE_BYTES, Command, LineSplitter, ProtocolError, parse_command
from tuiwatch.wire.tcp import field_of, hello_line, hello_nonce, proof, proof_holds

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20,
)
FIELDS = [
    "step",
    "loss",
    "lr",
    "grad_norm",
    "param_norm",
    "update_norm",
    "opt_step",
    "batch_ids",
    "finite",
    "rss",
    "mem_allocated",
    "data_wait_s",
    "compute_s",
    "training",
    "classes",
    "oom",
    "rank",
    "val_loss",
    "t",
    "severity",
    "rule",
    "message",
    "evidence",
    "id",
    "action",
    "ok",
    "path",
    "bytes",
    "reason",
    "gpus",
]
records = st.builds(
    lambda kind, fields: {"kind": kind, **fields},
    st.sampled_from([*KINDS, "other"]),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=12),
)


@FUZZ
@given(st.binary(max_size=300))
def test_a_command_line_is_a_command_or_a_protocol_error(line: bytes):
    with contextlib.suppress(ProtocolError):
        assert isinstance(parse_command(line), Command)


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.builds(lambda n, p: hello_line(n) + p, st.text(max_size=40), st.binary())))
def test_a_handshake_line_is_understood_or_refused_never_a_crash(line: bytes):
    nonce = hello_nonce(line)
    assert nonce is None or (isinstance(nonce, str) and 0 < len(nonce) <= 128)
    given = field_of(line, "proof")
    assert not proof_holds(given, "f" * 64, "viewer", "a" * 32, "b" * 32) or given == proof(
        "f" * 64, "viewer", "a" * 32, "b" * 32
    )


@FUZZ
@given(st.lists(st.binary(max_size=4000), max_size=40))
def test_the_line_splitter_stays_bounded_whatever_the_chunks(chunks: list[bytes]):
    splitter = LineSplitter(limit=1024)
    for chunk in chunks:
        try:
            lines = splitter.feed(chunk)
        except ProtocolError:
            return  # the connection is closed: the buffer goes with it
        assert all(len(line) <= 1024 for line in lines)
        assert len(splitter._buf) <= 1024


@FUZZ
@given(st.binary(max_size=MAX_LINE_BYTES // 64))
def test_decode_gives_a_record_or_a_decode_error(line: bytes):
    with contextlib.suppress(DecodeError):
        assert isinstance(decode(line), dict)


@FUZZ
@given(st.lists(records, max_size=60))
def test_rules_and_report_take_any_records(stream: list[dict[str, Any]]):
    alerts = Diagnosis().run(stream)
    assert all(a["kind"] == "alert" and a["rule"] for a in alerts)
    summary = summarize(stream)
    assert isinstance(as_text(summary), str)


@FUZZ
@given(st.lists(records, max_size=60))
def test_the_viewer_state_takes_any_records_and_stays_bounded(stream: list[dict[str, Any]]):
    state = RunState()
    state.apply_all(stream)
    assert len(state.alerts) <= MAX_ALERTS
    assert len(state.metrics) <= MAX_METRICS


@FUZZ
@given(
    st.dictionaries(st.sampled_from(["mem_total", "device"]), values),
    st.one_of(
        st.none(),
        st.lists(
            st.dictionaries(
                st.sampled_from(
                    ["index", "device", "util", "mem_used", "mem_total", "temp", "power", "process_mem_used"]
                ),
                values,
            ),
            max_size=4,
        ),
    ),
    st.dictionaries(st.sampled_from(["cpu_percent", "rss", "workers", "workers_cpu_percent"]), values),
    st.floats(),
    st.floats(),
    st.integers(0, 300),
)
def test_the_memory_pane_draws_any_readings(
    run: dict[str, Any],
    gpus: list[dict[str, Any]] | None,
    system: dict[str, Any],
    used: float,
    total: float,
    width: int,
):
    state = RunState(run=run, last_system={**system, "gpus": gpus})
    lines = [cpu_line(memory_view(state, None), width).plain] + [gpu_line(gpu_view(g), width).plain for g in gpus or []]
    assert all(len(line) <= width for line in lines)  # whole pieces that fit, never one cut into another number
    found = device_total(run, gpus)
    assert found is None or found > 0
    if total > 0 and math.isfinite(total) and math.isfinite(used):
        lines.append(bar("peak", used, total, width).plain)
    assert all("\x1b" not in line and "\n" not in line for line in lines)
