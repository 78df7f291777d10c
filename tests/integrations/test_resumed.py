"""The link a framework's resumed run writes: what the checkpoint kept, mapped to this rank's own ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tuiwatch.integrations import resumed
from tuiwatch.publisher.watch import Watch


def job(tmp_path: Path, ranks: list[int]) -> Path:
    """A job directory as a multi-rank run leaves it: one rankN directory with its ledger per rank."""
    for rank in ranks:
        (tmp_path / f"rank{rank}").mkdir()
        (tmp_path / f"rank{rank}" / "ledger.jsonl").write_text('{"kind":"run","t":0}\n')
    return tmp_path


def test_a_link_names_the_checkpoint_the_step_and_the_ledger_it_saved(tmp_path: Path):
    saved = {"ledger": "/runs/a/ledger.jsonl", "run_id": "abc", "name": "a", "rank": 0, "step": 40}
    assert resumed.link(saved, step=40, checkpoint="/out/checkpoint-40", rank=0) == {
        "checkpoint": "/out/checkpoint-40",
        "step": 40,
        "opt_steps": 40,
        "ledger": "/runs/a/ledger.jsonl",
        "run_id": "abc",
        "name": "a",
    }


def test_another_rank_links_to_its_own_ledger_of_the_same_job(tmp_path: Path):
    root = job(tmp_path, [0, 1])
    saved = {"ledger": str(root / "rank0" / "ledger.jsonl"), "run_id": "abc", "name": "a", "rank": 0}
    assert resumed.link(saved, step=8, checkpoint=None, rank=1)["ledger"] == str(root / "rank1" / "ledger.jsonl")
    # A rank the earlier job did not have: the step and the checkpoint, and no ledger to join.
    assert resumed.link(saved, step=8, checkpoint=None, rank=2)["ledger"] is None


@pytest.mark.parametrize("saved", [None, {}, {"ledger": None}, "not a mapping"])
def test_a_checkpoint_that_kept_nothing_still_gives_the_step(saved: object):
    assert resumed.link(saved, step=3, checkpoint="c", rank=0) == {"checkpoint": "c", "step": 3, "opt_steps": 3}


def test_the_trainers_file_is_written_beside_its_checkpoint_and_read_back_for_this_rank(tmp_path: Path):
    model = nn.Linear(2, 2)
    with Watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "runs", quiet=True) as watch:
        checkpoint = tmp_path / "out" / "checkpoint-5"
        checkpoint.mkdir(parents=True)
        resumed.write_sidecar(str(checkpoint), watch)
        resumed.write_sidecar(str(tmp_path / "out" / "not-saved"), watch)  # no directory: nothing, no error
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-5"]
        kept = json.loads((checkpoint / "tuiwatch-rank0.json").read_text())
        assert kept == {
            "ledger": str(watch.ledger_path),
            "run_id": watch.run_record["run_id"],
            "name": watch.name,
            "rank": 0,
            "step": 0,
        }
        assert resumed.read_sidecar(str(checkpoint), 0) == kept
        assert resumed.read_sidecar(str(checkpoint), 3) == kept  # rank 0's, mapped by link()
        assert resumed.read_sidecar(str(tmp_path / "out"), 0) is None
        (checkpoint / "tuiwatch-rank0.json").write_text("{not json")
        assert resumed.read_sidecar(str(checkpoint), 0) is None
