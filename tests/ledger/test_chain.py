"""A resumed run's ledgers read as one run: the links followed back, each earlier part cut at the resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tuiwatch.ledger.chain import earlier_parts, read_run


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def ledger(run_id: str, steps: range, link: dict[str, Any] | None = None, loss: float = 1.0) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [{"kind": "run", "t": 0.0, "run_id": run_id, "resumed_from": link}]
    for s in steps:
        records.append({"kind": "step", "t": 1.0 + s, "step": s, "loss": loss})
        if s % 4 == 3:
            records.append({"kind": "eval", "t": 1.5 + s, "step": s, "val_loss": loss})
    records.append({"kind": "end", "t": 99.0, "reason": "killed"})
    return records


def three_parts(tmp_path: Path) -> tuple[Path, Path, Path]:
    a = write(tmp_path / "a" / "ledger.jsonl", ledger("a", range(0, 10), loss=1.0))
    b = write(tmp_path / "b" / "ledger.jsonl", ledger("b", range(4, 12), {"ledger": str(a), "step": 4}, loss=2.0))
    c = write(tmp_path / "c" / "ledger.jsonl", ledger("c", range(8, 15), {"ledger": str(b), "step": 8}, loss=3.0))
    return a, b, c


def test_a_chain_reads_oldest_first_each_part_cut_where_the_next_took_over(tmp_path: Path):
    _, _, c = three_parts(tmp_path)
    chain = read_run(c)
    steps = [(r["step"], r["loss"]) for r in chain.records if r["kind"] == "step"]
    assert steps == [(s, 1.0) for s in range(4)] + [(s, 2.0) for s in range(4, 8)] + [(s, 3.0) for s in range(8, 15)]
    evals = [(r["step"], r["val_loss"]) for r in chain.records if r["kind"] == "eval"]
    assert evals == [(3, 1.0), (7, 2.0), (11, 3.0)]
    assert [r["reason"] for r in chain.records if r["kind"] == "end"] == ["killed"]  # only the newest part's end
    assert chain.missing is None


def test_a_missing_earlier_ledger_keeps_what_is_there_and_says_why(tmp_path: Path):
    a, _, c = three_parts(tmp_path)
    a.unlink()
    chain = read_run(c)
    assert next(r["step"] for r in chain.records if r["kind"] == "step") == 4
    assert chain.missing is not None
    assert chain.missing.startswith(f"{a}: no ledger at")


def test_a_link_loop_is_cut(tmp_path: Path):
    b_path = tmp_path / "b" / "ledger.jsonl"
    a = write(tmp_path / "a" / "ledger.jsonl", ledger("a", range(0, 6), {"ledger": str(b_path), "step": 2}))
    write(b_path, ledger("b", range(4, 8), {"ledger": str(a), "step": 4}))
    chain = read_run(b_path)
    assert chain.missing == f"{b_path} links back to a later part"
    assert [r["step"] for r in chain.records if r["kind"] == "step"] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_earlier_parts_are_what_a_replay_shows_before_the_file(tmp_path: Path):
    _, _, c = three_parts(tmp_path)
    assert [r["step"] for r in earlier_parts(c).records if r["kind"] == "step"] == list(range(8))
    assert earlier_parts(tmp_path / "a" / "ledger.jsonl").records == []
