"""``report``'s summary: one streamed pass, evals summarised, a best loss that is not one lucky batch."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Iterator
from typing import Any

from tuiwatch.analysis.report import as_text, lower_is_better, summarize


def ledger(steps: int, evals_every: int = 1000) -> Iterator[dict[str, Any]]:
    yield {"kind": "run", "t": 0.0, "name": "long", "run_id": "r1"}
    for i in range(steps):
        # A falling loss with one lucky batch at 0.001 early on: the smoothed best is not that batch.
        loss = 0.001 if i == 500 else 2.0 / (1 + i / 1000) + 0.1 * math.sin(i)
        yield {"kind": "step", "t": float(i), "step": i, "loss": loss, "lr": [0.1], "batch_ids": list(range(32))}
        if i % evals_every == evals_every - 1:
            yield {"kind": "eval", "t": float(i), "step": i, "val_loss": 1.0 + abs(i - 6000) / 10000, "val_acc": 0.5}
    yield {"kind": "end", "t": float(steps), "reason": "finished"}


def test_a_long_ledger_is_summarised_in_bounded_memory():
    tracemalloc.start()
    try:
        summary = summarize(ledger(20_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary["steps"] == 20_000
    # 20,000 step records held at once would be tens of MB; streamed, the rules' windows are all that stays.
    assert peak < 8 * 2**20


def test_the_best_loss_is_a_mean_of_steps_and_evals_have_their_best_and_last():
    summary = summarize(ledger(10_000))
    assert summary["min_loss"] == 0.001
    assert summary["best_loss"] > 0.15  # the mean of the last 100 steps (~0.18), not the 0.001 batch
    assert summary["best_step"] > 9_900  # near the end, where the loss is lowest
    val = summary["eval_metrics"]["val_loss"]
    assert (val["best"], val["best_step"]) == (1.0 + 1 / 10000, 5999)
    assert (val["last"], val["last_step"]) == (1.0 + 3999 / 10000, 9999)
    text = as_text(summary)
    assert "eval       val_loss: last 1.4 at step 9999, best 1 at step 5999" in text
    assert "best mean of 100 steps" in text


def test_an_eval_metrics_direction_comes_from_its_name():
    assert lower_is_better("val_loss") is True
    assert lower_is_better("eval/perplexity") is True
    assert lower_is_better("top1_acc") is False
    assert lower_is_better("bleu") is False
    assert lower_is_better("lr") is None


def test_report_replays_the_rules_the_run_ran_not_those_it_turned_off():
    steps = [
        {"kind": "step", "t": float(i), "step": i, "loss": 40.0 if i == 100 else 1.0 + 0.01 * (i % 7), "lr": [0.1]}
        for i in range(200)
    ]
    run = {"kind": "run", "t": 0.0, "name": "rl", "run_id": "r1"}

    def replayed(**fields: Any) -> set[str]:
        return set(summarize([{**run, **fields}, *steps])["alerts"])

    assert replayed() == {"loss-spike"}  # an older ledger (no rules field): every rule, its defaults
    assert replayed(rules={"loss-spike": False}) == set()  # tuiwatch run --rules '{"loss-spike": false}'
    assert replayed(rules=["nonfinite"]) == set()
    assert replayed(rules={"loss-spike": {"ratio": 100.0}}) == set()  # its thresholds too
    assert replayed(rules={"no-such-rule": False}) == {"loss-spike"}  # unreadable here: the defaults


def test_a_short_runs_length_is_given_to_a_tenth_of_a_second_and_a_long_ones_in_whole_units():
    # pytorch/examples' mnist_rnn on a small dataset: 188 steps "in 0s".
    def run(seconds: float) -> list[dict[str, Any]]:
        return [
            {"kind": "run", "t": 100.0, "name": "short", "run_id": "r"},
            {"kind": "step", "t": 100.0 + seconds, "step": 0, "loss": 1.0},
        ]

    lines = [
        next(x for x in as_text(summarize(run(s))).splitlines() if x.startswith("steps")) for s in (0.94, 12.7, 125)
    ]
    assert lines == ["steps      1 in 0.9s, 0 evals", "steps      1 in 12s, 0 evals", "steps      1 in 2m05s, 0 evals"]


def test_the_rules_a_run_turned_off_are_said_with_the_reason_it_gave():
    note = "reinforcement learning (gymnasium is imported): a policy's loss and gradients jump with each new rollout"
    run = {"kind": "run", "t": 0.0, "name": "ppo", "rules": {"loss-spike": False, "grad-explosion": False}}
    steps = [{"kind": "step", "t": float(i), "step": i, "loss": 10.0 if i == 30 else 1.0} for i in range(60)]
    summary = summarize([{**run, "rules_note": note}, *steps])
    assert summary["alerts"] == {}  # loss-spike did not run, so the replay does not raise it either
    lines = as_text(summary).splitlines()
    assert lines[lines.index("alerts     none") + 1] == f"rules      off: loss-spike, grad-explosion; {note}"
    assert not any(x.startswith("rules") for x in as_text(summarize([{**run, "rules": None}, *steps])).splitlines())


def test_one_eval_and_one_nonfinite_step_are_said_in_the_singular_and_a_replayed_alert_is_not_in_the_runs_length():
    # MMEngine's example stopped at its first NaN: "nonfinite  1 steps". And an alert the rules raise on replay (this
    # ledger has none written) is made at the report's time: the run's length read "2 in 20.79kd", to today.
    records: list[dict[str, Any]] = [
        {"kind": "run", "t": 0.0, "name": "one", "run_id": "r"},
        {"kind": "step", "t": 1.0, "step": 0, "loss": 1.0, "finite": {"loss": True}},
        {"kind": "eval", "t": 1.5, "step": 0, "val_loss": 1.0},
        {"kind": "step", "t": 2.0, "step": 1, "loss": math.nan, "finite": {"loss": False}},
        {"kind": "end", "t": 2.0, "reason": "nonfinite"},
    ]
    lines = as_text(summarize(records)).splitlines()
    assert "steps      2 in 2.0s, 1 eval" in lines
    assert "nonfinite  1 step" in lines
    assert "  nonfinite        critical x1  first at step 1" in lines  # replayed
