from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuiwatch.ledger.codec import DecodeError, _has_nonfinite, decode, encode
from tuiwatch.ledger.reader import read_ledger, tail_records
from tuiwatch.ledger.writer import FileLedger, MemoryTail

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8), st.sampled_from(["run", "system", "x-new"]))
def test_any_record_survives_a_round_trip(fields, kind):
    record = {**fields, "kind": kind}
    line = encode(record)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode(line) == record


any_values = st.recursive(
    json_scalars | st.floats(allow_nan=True, allow_infinity=True) | st.floats(min_value=1e307),
    lambda children: (
        st.lists(children, max_size=5) | st.tuples(children) | st.dictionaries(st.text(max_size=4), children)
    ),
    max_leaves=20,
)


def holds_nonfinite(value: object) -> bool:
    """The plain definition the fast scan must agree with."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(holds_nonfinite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(holds_nonfinite(v) for v in value)
    return False


@given(any_values)
def test_the_fast_nonfinite_scan_agrees_with_the_definition(value):
    assert _has_nonfinite(value) == holds_nonfinite(value)
    assert _has_nonfinite({"kind": "step", "x": value}) == holds_nonfinite(value)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_step_metrics_keep_nan_and_inf_through_a_round_trip(value):
    back = decode(encode({"kind": "step", "step": 1, "loss": value, "lr": [value]}))
    if math.isnan(value):
        assert math.isnan(back["loss"])
        assert math.isnan(back["lr"][0])
    else:
        assert back["loss"] == value
        assert back["lr"] == [value]


def test_nonfinite_floats_are_written_as_strings_jq_can_read():
    line = encode({"kind": "step", "loss": math.inf, "grad_norm": math.nan})
    assert orjson.loads(line) == {"kind": "step", "loss": "inf", "grad_norm": "nan"}


def test_unknown_fields_and_kinds_are_kept(tmp_path: Path):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(encode({"kind": "future", "t": 1.0, "extra": {"a": [1, 2]}}) + encode({"kind": "step", "new": 3}))
    assert list(read_ledger(path)) == [{"kind": "future", "t": 1.0, "extra": {"a": [1, 2]}}, {"kind": "step", "new": 3}]


def test_torn_last_line_is_skipped_and_counted(tmp_path: Path):
    path = tmp_path / "ledger.jsonl"
    good = [encode({"kind": "step", "step": i, "loss": 0.5}) for i in range(3)]
    path.write_bytes(b"".join(good) + encode({"kind": "step", "step": 3, "loss": 0.25})[:17])
    reader = read_ledger(path)
    assert [r["step"] for r in reader] == [0, 1, 2]
    assert reader.skipped == 1
    assert reader.torn_tail


def test_reader_takes_a_run_directory_and_skips_garbage_lines(tmp_path: Path):
    (tmp_path / "ledger.jsonl").write_bytes(encode({"kind": "run"}) + b"[1, 2]\n\xff\xfe\n" + encode({"kind": "end"}))
    reader = read_ledger(tmp_path)
    assert [r["kind"] for r in reader] == ["run", "end"]
    assert reader.skipped == 2
    assert not reader.torn_tail


def test_tail_records_returns_the_last_complete_records(tmp_path: Path):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"".join(encode({"kind": "step", "step": i}) for i in range(1000)))
    tail = tail_records(path, max_bytes=300)
    assert tail
    assert tail[-1]["step"] == 999
    assert [r["step"] for r in tail] == list(range(tail[0]["step"], 1000))


def test_file_ledger_reads_back_by_offset(tmp_path: Path):
    store = FileLedger(tmp_path / "ledger.jsonl")
    store.append(b"abc\n")
    store.append(b"defg\n")
    assert store.end == 9
    assert store.read(4, 100) == b"defg\n"
    assert store.read(0, 3) == b"abc"
    store.close()


def test_memory_tail_keeps_offsets_and_forgets_the_oldest():
    tail = MemoryTail(max_bytes=10)
    for chunk in (b"aaaa\n", b"bbbb\n", b"cccc\n"):
        tail.append(chunk)
    assert (tail.start, tail.end) == (5, 15)
    assert tail.read(0, 100) == b"bbbb\ncccc\n"  # what was forgotten is skipped, not invented
    assert tail.read(12, 100) == b"cc\n"


def test_a_line_nested_hundreds_deep_is_a_decode_error_not_a_recursion_error(tmp_path: Path):
    deep = b'{"kind":"step","step":1,"x":' + b"[" * 600 + b"]" * 600 + b"}"
    with pytest.raises(DecodeError, match="nested deeper than 32"):
        decode(deep)
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_bytes(b'{"kind":"step","step":0,"loss":1.0}\n' + deep + b'\n{"kind":"step","step":2,"loss":1.0}\n')
    reader = read_ledger(ledger)
    assert [r["step"] for r in reader] == [0, 2]
    assert reader.skipped == 1  # skipped and counted, like a torn line


def test_a_line_longer_than_any_record_is_skipped_in_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("tuiwatch.ledger.reader.MAX_RECORD_BYTES", 1024)  # a 3 GB line, scaled down
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_bytes(b'{"kind":"step","step":0}\n' + b"x" * 100_000 + b'\n{"kind":"step","step":2}\n' + b"y" * 5000)
    reader = read_ledger(ledger)
    assert [r["step"] for r in reader] == [0, 2]
    assert reader.skipped == 2  # the long line, and the long unterminated tail


def written(value: object) -> object:
    """What a line must hold for ``value``: non-finite floats as text, tuples as lists, the rest as it is."""
    if isinstance(value, float):
        return value if math.isfinite(value) else "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: written(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [written(v) for v in value]
    return value


@given(
    st.dictionaries(st.text(max_size=6), any_values, max_size=6),
    any_values,
    st.sampled_from(["plain", "null", "a null and a null"]),
)
def test_no_nan_or_inf_is_ever_written_as_null(fields, finite, text):
    # encode trusts a line whose nulls match the record's counted Nones; text holding "null", Nones nested
    # deeper than it counts, and each non-finite value must all end in the scan, never in a silent null.
    record = {**fields, "kind": "step", "finite": finite, "name": text}
    assert orjson.loads(encode(record)) == written(record)


def test_a_step_record_without_nan_is_written_as_orjson_writes_it():
    record = {"kind": "step", "loss": 0.5, "param_norm": None, "finite": {"batch": True, "param": None}}
    assert encode(record) == orjson.dumps(record) + b"\n"
    assert orjson.loads(encode({**record, "param_norm": math.nan}))["param_norm"] == "nan"


def test_a_value_orjson_cannot_write_is_written_plain_and_never_costs_the_record():
    # A custom sampler's numpy ints in batch_ids made orjson raise, and the publisher lost every record of the
    # batch it was writing. numpy's scalars are numbers; anything else is written as its text.
    import numpy as np

    class Odd:
        def __str__(self) -> str:
            return "odd" * 100

    record = {
        "kind": "step",
        "step": 3,
        "batch_ids": [np.int64(7), np.int32(-2), 2**70],
        "loss": np.float32(0.5),
        "acc": np.float64("nan"),
        "flag": np.bool_(True),
        "flags": np.array([True, False]),
        "note": Odd(),
    }
    line = encode(record)  # type: ignore[arg-type]
    back = decode(line)
    assert back["batch_ids"] == [7, -2, str(2**70)]
    assert type(back["batch_ids"][0]) is int
    assert back["loss"] == 0.5
    assert math.isnan(back["acc"])
    assert back["flag"] is True
    assert back["flags"] == "[ True False]"  # an array is no scalar: its text
    assert back["note"] == ("odd" * 100)[:200]
