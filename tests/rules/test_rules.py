"""Each rule, table-tested from small ledgers: when it fires, once per episode, and when it clears."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.records import Record
from tuiwatch.rules import REGISTRY, Diagnosis, for_reinforcement_learning, thresholds
from tuiwatch.rules.loss import LossChance

LEDGERS = Path(__file__).parents[1] / "fixtures" / "ledgers"


def test_a_loss_that_goes_below_zero_is_no_classifiers_and_never_at_chance():
    # REINFORCE (pytorch/examples): a policy with a (1, 2) softmax output, whose loss -log p(a) * R over returns
    # normalised to mean 0 swings around 0; four in a row at ln 2 or above read as "back to chance" twice in a run
    # that solved CartPole. A cross-entropy is never negative.
    rng = random.Random(5)  # noqa: S311 - reproducible noise, not a secret
    records = [step(i, loss=rng.gauss(0.0, 1.5), classes=2 if i == 0 else None) for i in range(400)]
    assert [r for r in records[:10] if r["loss"] < 0]  # as the real run: the first below 0 came at step 5
    assert fired(records, "loss-chance") == []
    # Kept above 0 (learned near 0, then ten steps at 1.0 > ln 2), the same run is still judged, and fires.
    assert fired([{**r, "loss": abs(r["loss"]) * 0.05 if r["step"] < 390 else 1.0} for r in records], "loss-chance")
    # An alert already active when the first negative loss comes clears: it was not about a classifier.
    stuck = [step(i, loss=math.log(2), classes=2 if i == 0 else None) for i in range(250)]
    stuck += [step(250, loss=-0.3), step(251, loss=0.7)]
    assert fired(stuck, "loss-chance") == [("loss-chance", 199, "warning"), ("loss-chance", 250, "info")]


FINITE = {"batch": True, "forward": True, "loss": True, "grad": True, "param": True}


def step(i: int, **fields: Any) -> dict[str, Any]:
    record = {
        "kind": "step",
        "step": i,
        "loss": 1.0 / (i + 1),
        "lr": [0.1],
        "grad_norm": 1.0 + 0.01 * (i % 5),
        "opt_step": i + 1,
        "data_wait_s": 0.001,
        "compute_s": 0.01,
        "finite": dict(FINITE),
    }
    record.update(fields)
    return record


def fired(records: Sequence[Record], rule: str | None = None) -> list[tuple[str, int | None, str]]:
    alerts = Diagnosis([rule] if rule else None).run(records)
    return [(a["rule"], a["step"], a["severity"]) for a in alerts]


def test_healthy_ledgers_raise_nothing():
    for name in ("healthy.jsonl", "killed.jsonl"):
        assert Diagnosis().run(read_ledger(LEDGERS / name)) == []
    assert fired([step(i) for i in range(500)]) == []


def test_nonfinite_names_the_first_failing_boundary_once_per_episode():
    records = [step(i) for i in range(10)]
    for i in (4, 5):
        records[i] = step(
            i, loss=math.inf, grad_norm=math.nan, finite={**FINITE, "loss": False, "grad": False, "param": False}
        )
    alerts = Diagnosis(["nonfinite"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(4, "critical"), (6, "info")]
    assert alerts[0]["evidence"]["boundary"] == "loss"
    assert alerts[0]["message"] == "first at step 4, boundary=loss (loss inf, grad norm nan)"
    assert alerts[0]["next_check"].startswith("the loss: finite outputs gave a non-finite loss")


def test_nonfinite_advice_follows_the_boundary_and_numbers_are_short():
    bad_param = step(3, loss=0.1 + 0.2, grad_norm=1.0 / 3, finite={**FINITE, "param": False})
    (alert,) = Diagnosis(["nonfinite"]).run([step(0), bad_param])
    assert alert["message"] == "first at step 3, boundary=param (loss 0.3, grad norm 0.3333)"
    assert alert["next_check"].startswith("the update: finite gradients made the weights non-finite")
    assert "batch" not in alert["next_check"]


def test_nonfinite_says_which_boundaries_before_the_failing_one_were_not_checked():
    # A loop that calls model.forward(x) skips the Watch's hook: the output is not checked. A NaN from the model's
    # own log() was named "the loss: finite outputs gave a non-finite loss", a claim about outputs never seen.
    unseen_output = {**FINITE, "forward": None, "loss": False, "grad": False, "param": None}
    (alert,) = Diagnosis(["nonfinite"]).run([step(0, loss=math.nan, grad_norm=math.nan, finite=unseen_output)])
    assert (
        alert["message"] == "first at step 0, boundary=loss (loss nan, grad norm nan); not checked before it: forward"
    )
    assert alert["evidence"]["unchecked"] == ["forward"]
    assert alert["next_check"].startswith("the loss, or the model: the loss is non-finite and the model's output was")
    assert "finite outputs" not in alert["next_check"]
    # Its batch unseen (nanoGPT's get_batch under the three lines): the output's failure is not the model's alone.
    unseen_batch = {**FINITE, "batch": None, "forward": False, "loss": False, "grad": False}
    (alert,) = Diagnosis(["nonfinite"]).run([step(0, finite=unseen_batch)])
    assert alert["evidence"]["unchecked"] == ["batch"]
    assert alert["next_check"].startswith("the model, or the data:")
    # Only the boundary right before the failing one decides the advice; the others are listed.
    unseen_batch_only = {**FINITE, "batch": None, "loss": False, "grad": False}
    (alert,) = Diagnosis(["nonfinite"]).run([step(0, finite=unseen_batch_only)])
    assert alert["evidence"]["unchecked"] == ["batch"]
    assert alert["next_check"].startswith("the loss: finite outputs gave a non-finite loss")


def test_a_nonfinite_batch_the_model_handles_is_one_info_for_the_run_not_a_critical_episode():
    # Missing values encoded as NaN and imputed inside the forward: the batch is non-finite at nearly every step,
    # the output, loss and gradients are not. That was a critical alert, active for the whole healthy run.
    handled = {**FINITE, "batch": False}
    records = [step(i, finite=handled if i % 3 else dict(FINITE), batch_ids=[i, 100 + i]) for i in range(60)]
    alerts = Diagnosis(["nonfinite"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(1, "info")]
    assert alerts[0]["evidence"] == {"boundary": "batch", "handled": True, "batch_ids": [1, 101]}
    assert "the model handles them" in alerts[0]["message"]
    # Where the NaN reaches the loss (a NaN target) or the gradients, the batch is the broken link, as before.
    for failed in ({"loss": False}, {"grad": False}):
        bad = step(5, finite={**handled, **failed})
        assert fired([step(0), bad], "nonfinite") == [("nonfinite", 5, "critical")]
        assert Diagnosis(["nonfinite"]).run([step(0), bad])[0]["evidence"]["boundary"] == "batch"
    # A real episode (the model's output went NaN) ends at a step whose only non-finite value is a handled batch.
    diverged = step(3, finite={**handled, "forward": False, "loss": False})
    records = [step(0, finite=handled), step(1), step(2, finite=handled), diverged, step(4, finite=handled)]
    alerts = Diagnosis(["nonfinite"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(0, "info"), (3, "critical"), (4, "info")]
    # The batch is the first non-finite link, but this run's batches always were: the message says so.
    assert alerts[1]["message"].endswith("; the model handled non-finite batches before (step 0): look at forward too")
    assert alerts[1]["evidence"]["batch_handled_at"] == 0
    # A lone non-finite batch whose output and loss were not measured stays critical, named the batch's.
    unmeasured = step(7, finite={"batch": False, "forward": None, "loss": None, "grad": None, "param": None})
    assert fired([step(0, finite=handled), unmeasured], "nonfinite") == [
        ("nonfinite", 0, "info"),
        ("nonfinite", 7, "critical"),
    ]


def test_grad_explosion_fires_when_norm_grows_100x():
    records = [step(i) for i in range(30)] + [step(30, grad_norm=4.0), step(31, grad_norm=800.0)]
    alerts = Diagnosis(["grad-explosion"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(31, "warning")]
    assert "last: 1.03 → 1.04 → 4 → 800" in alerts[0]["message"]
    assert alerts[0]["evidence"]["grad_norm"] == 800.0
    calm = [step(i) for i in range(32, 60)]
    assert fired([*records, *calm], "grad-explosion") == [
        ("grad-explosion", 31, "warning"),
        ("grad-explosion", 51, "info"),
    ]


def test_grad_explosion_keeps_its_window_minimum_right_as_norms_enter_and_leave():
    # The rule keeps a lower bound of the window's least norm to skip most looks; a norm of 0.001 that slid out
    # of the 50-step window must not keep hiding a jump of 150x over the norms still in it.
    records = [step(0, grad_norm=0.001)] + [step(i, grad_norm=1.0) for i in range(1, 60)] + [step(60, grad_norm=150.0)]
    assert fired(records, "grad-explosion") == [("grad-explosion", 60, "warning")]
    # And every norm that enters lowers the bound: after a drop to 0.01, a norm of 5 is 500x the median.
    dropped = [step(i, grad_norm=1.0) for i in range(30)] + [step(i, grad_norm=0.01) for i in range(30, 90)]
    assert fired([*dropped, step(90, grad_norm=5.0)], "grad-explosion") == [("grad-explosion", 90, "warning")]


def test_grad_explosion_needs_history_but_not_for_huge_norms():
    assert fired([step(0, grad_norm=1e3), step(1, grad_norm=1e5)], "grad-explosion") == []
    assert fired([step(0, grad_norm=2e6)], "grad-explosion") == [("grad-explosion", 0, "warning")]


@pytest.mark.parametrize("norm", [0.0, None])
def test_grad_zero_fires_after_five_optimizer_steps_without_gradient(norm: float | None):
    records = [step(i, grad_norm=norm) for i in range(8)]
    assert fired(records, "grad-zero") == [("grad-zero", 4, "critical")]


def test_zero_gradients_of_a_zero_loss_are_a_loss_at_its_floor_not_a_broken_graph():
    # A2C on CartPole once solved (stable-baselines3, under tuiwatch run): returns predicted exactly, loss and
    # gradients exactly 0.0 for 10 steps; grad-zero said "critical: a detached graph" twice in a healthy run.
    solved = [step(i, loss=0.0, grad_norm=0.0) for i in range(10)]
    assert fired([step(i) for i in range(3)] + solved + [step(13)], "grad-zero") == []
    detached = [step(i, loss=0.7, grad_norm=0.0) for i in range(5)]
    assert fired([step(0), *solved[1:3], *detached], "grad-zero") == [("grad-zero", 4, "critical")]
    missing = [step(i, loss=0.0, grad_norm=None) for i in range(5)]  # no .grad at all: broken whatever the loss
    assert fired(missing, "grad-zero") == [("grad-zero", 4, "critical")]


def test_a_loss_of_zero_since_the_first_step_with_zero_gradients_never_depended_on_the_model():
    # pytorch/examples' DDP tutorial (multigpu_torchrun.py): a Linear(20, 1) regression trained with cross_entropy
    # against float targets. Over one output column the softmax is 1, so the loss is -0.0 and every gradient 0.0 at
    # every step; grad-zero took it for a loss at its floor and only loss-frozen spoke, pointing at the lr.
    never = [step(i, loss=-0.0, grad_norm=0.0) for i in range(60)]
    alerts = Diagnosis(["grad-zero", "loss-frozen"]).run(never)
    assert [(a["rule"], a["step"], a["severity"]) for a in alerts] == [
        ("grad-zero", 4, "critical"),
        ("loss-frozen", 49, "warning"),
    ]
    zero, frozen = alerts
    assert (
        zero["message"]
        == "gradients are all zero for 5 optimizer steps, and the loss has been 0 at every step since the first"
    )
    assert "does not depend on the model" in zero["next_check"]
    assert "mse_loss" in zero["next_check"]
    assert frozen["message"] == "loss is -0.0 for 50 steps in a row, every gradient zero"
    assert frozen["evidence"] == {"loss": -0.0, "steps": 50, "zero_grad_steps": 50}
    assert frozen["next_check"].startswith("the loss does not depend on the model")
    # Watched from a later step (a resumed run of a solved task), its start is unseen: a loss at its floor.
    assert fired([step(i, loss=0.0, grad_norm=0.0) for i in range(100, 110)], "grad-zero") == []
    # A frozen loss whose gradients are not all zero keeps the lr advice.
    (moving,) = Diagnosis(["loss-frozen"]).run([step(i, loss=0.5, grad_norm=0.0 if i % 2 else 1.0) for i in range(50)])
    assert moving["next_check"] == "the model is not changing: look at the update norm and the lr"
    assert "zero_grad_steps" not in moving["evidence"]


def test_a_loss_that_fell_to_exactly_zero_is_at_its_floor_not_frozen():
    # A transfer-learning tutorial (bruce1408/Pytorch_learning, 6_11_TransferLearning_0.py) fits a regression to one
    # sample: its MSE falls from 0.78 to exactly 0.0 by step 45, every gradient 0 from there. loss-frozen said "the
    # loss does not depend on the model" at step 94 of a run that had just learned it.
    fitted = [step(i, loss=0.78 / (i + 1), grad_norm=1.0 / (i + 1)) for i in range(45)]
    fitted += [step(i, loss=0.0, grad_norm=0.0) for i in range(45, 100)]
    assert fired(fitted, "loss-frozen") == []
    # Frozen at any other value, or at 0 with gradients, it still speaks.
    assert fired(fitted[:45] + [step(i, loss=0.25, grad_norm=0.0) for i in range(45, 100)], "loss-frozen") == [
        ("loss-frozen", 94, "warning")
    ]
    assert fired(fitted[:45] + [step(i, loss=0.0, grad_norm=0.5) for i in range(45, 100)], "loss-frozen") == [
        ("loss-frozen", 94, "warning")
    ]


def test_steps_without_an_optimizer_step_are_not_zero_gradients():
    assert fired([step(i, grad_norm=None, opt_step=None) for i in range(20)], "grad-zero") == []


def test_loss_frozen_fires_after_fifty_identical_losses():
    records = [step(i, loss=0.6931471805599453) for i in range(60)]
    assert fired(records, "loss-frozen") == [("loss-frozen", 49, "warning")]


def test_lr_zero_ignores_a_warm_up_that_starts_at_zero():
    warmup = [step(i, lr=[0.0]) for i in range(3)] + [step(i, lr=[0.01 * i]) for i in range(3, 20)]
    assert fired(warmup, "lr-zero") == []
    assert fired([step(i, lr=[0.0, 0.0]) for i in range(12)], "lr-zero") == [("lr-zero", 9, "warning")]


def test_eval_mode_fires_on_eval_records_in_training_mode():
    records = [step(0), {"kind": "eval", "step": 0, "val_loss": 0.3, "training": True}]
    assert fired(records, "eval-mode") == [("eval-mode", 0, "warning")]
    assert fired([{"kind": "eval", "step": 0, "val_loss": 0.3, "training": False}], "eval-mode") == []


def test_data_bound_fires_when_waiting_dominates_and_clears_when_it_stops():
    slow = [step(i, data_wait_s=0.03, compute_s=0.01) for i in range(60)]
    fast = [step(i, data_wait_s=0.001, compute_s=0.01) for i in range(60, 120)]
    # Time-weighted: it clears once the wait is under 30 % of the window's time, its 5 longest waits left out
    # (10 slow steps of 50 left).
    assert fired(slow + fast, "data-bound") == [("data-bound", 49, "warning"), ("data-bound", 99, "info")]


def test_data_bound_weighs_time_and_names_one_slow_worker_on_a_fast_or_a_loaded_machine():
    # Three loader workers, one reading a slow shard: every 3rd batch waits 130 ms, the others 1 ms.
    for compute in (0.005, 0.015):  # an idle machine, and the same run with compute 3x slower beside other jobs
        records = [step(i, data_wait_s=0.13 if i % 3 == 2 else 0.001, compute_s=compute) for i in range(96)]
        alerts = [a for a in Diagnosis(["data-bound"]).run(records) if a["severity"] == "warning"]
        assert [a["step"] for a in alerts] == [49]
        evidence = alerts[0]["evidence"]
        assert evidence["period"] == 3
        assert evidence["pattern"] == "every 3rd batch waits: one slow worker or shard"
        assert evidence["data_wait_share"] > 0.6


def test_data_bound_blames_no_worker_where_the_loader_has_none():
    # Lightning's PPO example: an IterableDataset runs a rollout every 4th batch, in the training process (the
    # system records say 0 workers). It said "one slow worker or shard".
    def run(workers: int | None) -> Record:
        records: list[Record] = []
        for i in range(60):
            if i % 10 == 0 and workers is not None:
                records.append({"kind": "system", "t": float(i), "workers": workers})
            records.append(step(i, data_wait_s=0.2 if i % 4 == 3 else 0.001, compute_s=0.01))
        alerts = [a for a in Diagnosis(["data-bound"]).run(records) if a["severity"] == "warning"]
        assert [a["step"] for a in alerts] == [49]
        return alerts[0]

    none = run(0)
    assert (
        none["evidence"]["pattern"] == "every 4th batch waits: the dataset makes them in bursts, with no loader workers"
    )
    assert (none["evidence"]["period"], none["evidence"]["workers"]) == (4, 0)
    assert none["next_check"].startswith("make the batches beside the training: loader workers (num_workers)")
    for workers in (4, None):  # four workers, one of them slow; or a ledger without system records
        alert = run(workers)
        assert alert["evidence"]["pattern"] == "every 4th batch waits: one slow worker or shard"
        assert alert["next_check"].endswith("; find the slow worker or shard")


def test_unknown_rule_ids_are_refused():
    with pytest.raises(ValueError, match="unknown rule ids \\['grad-explode'\\]"):
        Diagnosis(["grad-explode"])
    assert set(REGISTRY) <= {
        "nonfinite",
        "grad-explosion",
        "grad-zero",
        "no-update",
        "loss-frozen",
        "loss-chance",
        "lr-zero",
        "data-bound",
        "memory-growth",
        "oom",
        "overfit",
        "eval-mode",
        "loss-spike",
        "straggler",
    }


def test_rules_take_thresholds_and_can_be_turned_off():
    records = [step(i, lr=[0.0]) for i in range(6)]
    assert fired(records) == []
    alerts = Diagnosis({"lr-zero": {"steps": 3}, "grad-zero": False}).run(records)
    assert [(a["rule"], a["step"]) for a in alerts] == [("lr-zero", 2)]
    with pytest.raises(ValueError, match="rule 'lr-zero' has no threshold \\['step'\\]: its thresholds are steps"):
        Diagnosis({"lr-zero": {"step": 3}})
    # A threshold that is not a number would fail on the training process's publisher thread, at its first use.
    for value in ("3", None, True):
        with pytest.raises(ValueError, match=f"rule 'lr-zero': threshold steps takes a number, got {value!r}"):
            Diagnosis({"lr-zero": {"steps": value}})
    assert Diagnosis({"loss-chance": {"classes": None}}).rules  # None where it is the default: found from the run


def test_no_update_fires_when_gradients_arrive_but_parameters_stay():
    # The optimizer steps a copy: grads on the model, the model's parameters never move.
    records = [step(i, param_norm=4.2, update_norm=0.0 if i % 10 == 0 else None) for i in range(40)]
    alerts = Diagnosis(["no-update"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(20, "critical")]
    assert alerts[0]["evidence"]["same_param_steps"] == 20
    moving = [step(i, param_norm=4.2 + 0.01 * i, update_norm=0.01) for i in range(40)]
    assert fired(moving, "no-update") == []


def test_no_update_leaves_a_zero_lr_to_lr_zero():
    records = [step(i, lr=[0.0], param_norm=4.2, update_norm=0.0) for i in range(40)]
    assert fired(records, "no-update") == []
    assert fired(records, "lr-zero") == [("lr-zero", 9, "warning")]


def test_lr_zero_fires_on_a_collapsed_schedule_not_on_cosine_decay():
    per_batch_steplr = [step(i, lr=[0.1 * 0.1 ** (i // 30)]) for i in range(300)]
    assert fired(per_batch_steplr, "lr-zero") == [("lr-zero", 279, "warning")]
    n = 1000
    cosine = [step(i, lr=[0.05 * (1 + math.cos(math.pi * min(i, n) / n))]) for i in range(n + 1)]
    warm = [step(i, lr=[0.1 * i / 100]) for i in range(100)]
    assert (
        fired(
            warm + [step(100 + i, **{k: v for k, v in r.items() if k != "step"}) for i, r in enumerate(cosine)],
            "lr-zero",
        )
        == []
    )


def test_loss_chance_fires_at_ln_classes_not_on_a_good_plateau():
    rng = __import__("random").Random(0)
    chance = [step(i, loss=math.log(2) + rng.gauss(0, 0.01)) for i in range(300)]
    chance[0]["classes"] = 2
    assert fired(chance, "loss-chance") == [("loss-chance", 199, "warning")]
    good = [step(i, loss=0.05 + rng.gauss(0, 0.01), classes=2) for i in range(300)]
    assert fired(good, "loss-chance") == []
    learning = [step(i, loss=math.log(10) * (1 - i / 400) + rng.gauss(0, 0.01)) for i in range(300)]
    assert Diagnosis({"loss-chance": {"classes": 10}}).run(learning) == []


def test_loss_chance_waits_for_a_loss_still_falling_off_a_plateau_at_chance_up_to_falling_wait():
    # bench/overhead.py's 3x512 MLP (SGD 0.01): 0.985 ln(10) at step 199, falling, 0.04 ln(10) by step 750. It
    # was named "at chance" at 199 and cleared at ~400. A loss at chance that is still falling is waited for.
    rng = random.Random(6)  # noqa: S311 - reproducible noise, not a secret
    chance = math.log(10)
    slow = [chance - 0.0002 * i + rng.gauss(0, 0.01) for i in range(300)]  # 2.6 % lower by step 300
    slow += [max(slow[-1] - 0.01 * i, 0.1) + rng.gauss(0, 0.01) for i in range(400)]  # then it learns
    records = [step(i, loss=v, classes=10 if i == 0 else None) for i, v in enumerate(slow)]
    assert abs(statistics.median(slow[100:200]) - chance) < 0.1 * chance  # at chance by the window's test
    assert fired(records, "loss-chance") == []
    # Still at chance after falling_wait steps (a loss falling too slowly to leave ln C): named then.
    creeping = [step(i, loss=chance - 0.0004 * i + rng.gauss(0, 0.01), classes=10) for i in range(560)]
    assert fired(creeping, "loss-chance") == [("loss-chance", 499, "warning")]
    sooner = Diagnosis({"loss-chance": {"falling_wait": 300}}).run(creeping)
    assert [(a["rule"], a["step"]) for a in sooner] == [("loss-chance", 299)]
    # A flat loss at chance is not falling: named at min_steps, as before.
    flat = [step(i, loss=chance + rng.gauss(0, 0.01), classes=10) for i in range(300)]
    assert fired(flat, "loss-chance") == [("loss-chance", 199, "warning")]


def test_loss_chance_sees_chance_once_a_low_loss_has_left_its_window():
    # Five early losses far below ln(2), then the rest at chance: once the low ones slide out of the 100-step
    # window, "never learned" holds (the rule's lower bound of the window's least loss is refreshed, not kept).
    rng = random.Random(1)  # noqa: S311 - reproducible noise, not a secret
    records = [step(i, loss=0.2 + rng.gauss(0, 0.01), classes=2) for i in range(5)]
    records += [step(i, loss=math.log(2) + rng.gauss(0, 0.01)) for i in range(5, 300)]
    alerts = Diagnosis(["loss-chance"]).run(records)
    assert [(a["step"], "loss_median" in a["evidence"]) for a in alerts] == [(199, True)]


def test_loss_chance_clears_when_the_median_since_it_fired_falls_and_keeps_those_losses_sorted_meanwhile():
    # At chance for 150 steps after it fires (the window of 100 full and sliding), NaNs among them, then
    # learning: it clears at the step where the median of the losses since it fired drops under the floor.
    rng = random.Random(4)  # noqa: S311 - reproducible noise, not a secret
    losses = [math.log(2) + rng.gauss(0, 0.02) for _ in range(350)]
    losses[260] = math.nan
    losses += [0.1 + 0.01 * rng.random() for _ in range(200)]
    records = [step(i, loss=v, classes=2) for i, v in enumerate(losses)]
    rule = LossChance()
    said: list[tuple[Any, Any]] = []
    for record in records:
        alert = rule.observe(record)
        if alert is not None:
            said.append((alert["severity"], alert["step"]))
        if rule.active and rule.since is not None:  # what clears reads: the losses since it fired, sorted
            suffix = list(rule.recent)[-max(rule.since_fired, rule.jump) :]
            assert rule.since == sorted(suffix)
    # The reference: the first step after firing where the median of the finite losses since then (at least
    # jump, at most the window's 100) is under (1 - 2 x 0.1) ln 2.
    finite = [(i, v) for i, v in enumerate(losses) if math.isfinite(v)]
    fired_at: int = said[0][1]
    since = [v for i, v in finite if i <= fired_at][-4:]
    cleared = None
    for i, v in finite:
        if i <= fired_at:
            continue
        since = ([*since, v] if len(since) < 100 else [*since[1:], v]) if i > fired_at + 4 else [*since[1:], v]
        if statistics.median(since) < 0.8 * math.log(2):
            cleared = i
            break
    assert said == [("warning", 199), ("info", cleared)]
    assert cleared is not None
    assert cleared > 350


def test_loss_spike_fires_on_one_bad_batch_and_not_on_a_noisy_loss():
    rng = __import__("random").Random(1)
    noisy = [step(i, loss=1.0 + 0.3 * rng.random() + (0.4 if rng.random() < 0.05 else 0)) for i in range(1000)]
    assert fired(noisy, "loss-spike") == []
    spiked = [dict(r) for r in noisy[:200]]
    spiked[150] = step(150, loss=40.0, batch_ids=[7, 8, 9])
    alerts = Diagnosis(["loss-spike"]).run(spiked)
    # Judged 3 steps later (one batch, or the run changed?), named at its own step; 3 ordinary losses clear it.
    assert [(a["step"], a["severity"]) for a in alerts] == [(150, "warning"), (156, "info")]
    evidence = alerts[0]["evidence"]
    assert evidence["batch_ids"] == [7, 8, 9]
    assert evidence["rule"] == "3 x the window's largest loss"
    assert evidence["pattern"] == "one batch"
    assert evidence["next_losses"] == [r["loss"] for r in noisy[151:154]]


def test_loss_spike_evidence_is_the_bar_the_loss_crossed_not_the_one_after_the_window_moved():
    # The bar (3 x the window's largest loss, 1.0) is refreshed every 25 ordinary losses; one of the three losses
    # the rule waits for (2.9) enters the window and the refresh at the 50th raises the bar to 8.7 before the alert
    # is written. The evidence said "loss 5, bar 8.7": now the bar it crossed.
    losses = [1.0] * 48 + [5.0, 2.9, 1.0, 1.0]
    (alert,) = [a for a in Diagnosis(["loss-spike"]).run([step(i, loss=v) for i, v in enumerate(losses)])]
    evidence = alert["evidence"]
    assert (alert["step"], evidence["loss"], evidence["bar"], evidence["window_max"]) == (48, 5.0, 3.0, 1.0)
    assert evidence["median"] == 1.0
    assert "5x its recent median 1" in alert["message"]


def test_loss_spike_tells_a_level_shift_from_one_batch_and_starts_over_from_the_new_level():
    rng = random.Random(2)  # noqa: S311 - reproducible noise, not a secret
    records = [step(i, loss=(1.0 if i < 300 else 9.0) + 0.3 * rng.random(), batch_ids=[i]) for i in range(600)]
    alerts = [a for a in Diagnosis(["loss-spike"]).run(records) if a["severity"] != "info"]
    assert [a["step"] for a in alerts] == [300]  # once: the new level is the run's new noise, not 300 spikes
    assert alerts[0]["evidence"]["pattern"] == "level shift from this step"
    assert "stayed up" in alerts[0]["message"]
    assert alerts[0]["next_check"].startswith("what changed at this step")


def test_a_loss_back_at_chance_mid_run_is_named_at_its_step_before_the_jump_it_makes():
    rng = random.Random(3)  # noqa: S311 - reproducible noise, not a secret
    chance = math.log(4)
    # Learned (0.3-0.9), then labels that no longer follow the inputs from step 400: confidently wrong, then ~ln 4.
    records = [
        step(i, loss=0.3 + 0.6 * rng.random() if i < 400 else max(chance, 6.0 - 0.05 * (i - 400)) + 0.1 * rng.random())
        for i in range(600)
    ]
    records[0]["classes"] = 4
    alerts = [a for a in Diagnosis().run(records) if a["severity"] != "info"]
    assert [(a["rule"], a["step"]) for a in alerts][:2] == [("loss-chance", 400), ("loss-spike", 400)]
    evidence = alerts[0]["evidence"]
    assert evidence["loss_before"] < 0.5 * chance
    assert min(evidence["last_losses"]) >= chance
    assert "from this step on" in alerts[0]["message"]


def test_a_diverging_optimizer_is_not_called_labels_at_chance():
    # big-lr: a learned loss blows up past ln C, and the gradient norm with it (x30, then x2000).
    records = [step(i, loss=0.05 + 0.01 * (i % 3), grad_norm=0.1, classes=2 if i == 0 else None) for i in range(60)]
    records += [step(60 + i, loss=10.0 * 30**i, grad_norm=3.0 * 8**i) for i in range(6)]
    assert fired(records, "loss-chance") == []
    # The same jump with gradients a few times their median is labels that no longer follow the inputs.
    shuffled = records[:60] + [step(60 + i, loss=5.0, grad_norm=0.5) for i in range(6)]
    assert fired(shuffled, "loss-chance") == [("loss-chance", 60, "warning")]


def test_loss_chance_is_quiet_on_a_learned_loss_with_heavy_tails():
    # A learned classifier (median ~0.1 ln C) with one batch in ten at 2 x ln C: never four in a row.
    rng = random.Random(4)  # noqa: S311 - reproducible noise, not a secret
    records = [step(i, loss=2.8 if i % 10 == 0 else 0.15 * rng.expovariate(1.0), classes=4) for i in range(3000)]
    assert fired(records, "loss-chance") == []


def test_loss_spike_is_quiet_on_heavy_tailed_noise_through_a_step_decay_and_catches_a_far_jump():
    # A converged small-batch classifier: most batches ~0, one in a few dozen misclassified (a loss of 1-4),
    # the level dropping at each lr decay; the lr rising back (a warm restart) lifts the loss for a while.
    rng = random.Random(5)  # noqa: S311 - reproducible noise, not a secret
    records = []
    for i in range(3000):
        level = 0.5 if i < 1000 else 0.1 if i < 2000 else 0.03
        lr = 0.1 if i < 1000 or i >= 2500 else 0.01
        loss = level * rng.expovariate(1.0) + (rng.uniform(1, 4) if rng.random() < 0.03 else 0.0)
        if 2500 <= i < 2510:
            loss += 20.0 * (2510 - i) / 10  # the restart's own rise
        records.append(step(i, loss=loss, lr=[lr]))
    assert fired(records, "loss-spike") == []
    records[1500] = step(1500, loss=400.0, lr=[0.01], batch_ids=[3])  # features in the wrong units
    assert [(a["step"], a["severity"]) for a in Diagnosis(["loss-spike"]).run(records)][:1] == [(1500, "warning")]


def test_data_bound_ignores_a_one_off_slow_batch():
    records = [step(i) for i in range(200)]
    records[100] = step(100, data_wait_s=2.0, compute_s=0.01)
    assert fired(records, "data-bound") == []


def system(i: int, rss: float) -> dict[str, Any]:
    return {"kind": "system", "t": float(i), "rss": rss}


def test_memory_growth_fires_on_steady_growth_not_on_growth_that_plateaus():
    mib = 1 << 20
    leak = [system(i, 500 * mib + 20 * mib * i) for i in range(30)]
    alerts = Diagnosis(["memory-growth"]).run(leak)
    assert [a["severity"] for a in alerts] == ["warning"]
    assert alerts[0]["evidence"]["series"] == "rss"
    plateau = [system(i, 500 * mib + 40 * mib * min(i, 12)) for i in range(60)]
    assert fired(plateau, "memory-growth") == []
    cuda = [step(i, mem_allocated=100 * mib + 1 * mib * i) for i in range(600)]
    assert fired(cuda, "memory-growth")[0][:2] == ("memory-growth", 400)  # 200 steps in the last half


def _rss_run(rss_at: Any, steps: int, samples_per_step: float = 0.5) -> list[dict[str, Any]]:
    """Step records with a system sample every 1/samples_per_step steps: RSS as a function of the step."""
    out: list[dict[str, Any]] = []
    due = 0.0
    for i in range(steps):
        out.append(step(i))
        due += samples_per_step
        while due >= 1:
            due -= 1
            out.append(system(i, rss_at(i)))
    return out


def test_memory_growth_tells_steady_growth_from_a_step_change():
    mib = 1 << 20
    rng = random.Random(3)  # noqa: S311 - reproducible noise, not a secret

    def noise() -> float:
        return rng.uniform(-3, 3) * mib

    # An eval pass at step 300: twenty samples while no step runs, RSS 409 → 525 MiB, and it stays there.
    healthy = _rss_run(lambda i: 409 * mib + noise(), 300)
    healthy += [system(300, 409 * mib + (525 - 409) * mib * k / 20 + noise()) for k in range(20)]
    healthy += [r for r in _rss_run(lambda i: 525 * mib + noise(), 600)[300:]]
    assert fired(healthy, "memory-growth") == []
    # The allocator and caches warming up: fast growth that slows to a plateau.
    warming = _rss_run(lambda i: 300 * mib + 200 * mib * (1 - 0.99**i) + noise(), 1000)
    assert fired(warming, "memory-growth") == []
    # A leak of 0.25 MB a step on a loaded machine: few steps between samples, noise; named with its steps.
    leak = _rss_run(lambda i: 400 * mib + 0.25 * mib * i + noise(), 1000, samples_per_step=0.25)
    alerts = [a for a in Diagnosis(["memory-growth"]).run(leak) if a["severity"] == "warning"]
    assert len(alerts) == 1
    assert "grows with every step" in alerts[0]["message"]
    assert "watch.log(loss=loss) keeps nothing" in alerts[0]["next_check"]
    assert alerts[0]["evidence"]["to_step"] - alerts[0]["evidence"]["from_step"] >= 70


def test_oom_fires_from_the_step_that_failed():
    record = step(
        12,
        batch_shape=[[2, 524288, 8]],
        tokens=None,
        oom={
            "error": "OutOfMemoryError",
            "message": "CUDA out of memory",
            "mem_allocated": 70 << 30,
            "mem_reserved": 75 << 30,
        },
    )
    alerts = Diagnosis(["oom"]).run([step(11), record])
    assert alerts[0]["message"] == (
        "out of memory at step 12 with batch [[2, 524288, 8]]; 71,680 MiB allocated, 76,800 MiB reserved"
    )
    assert alerts[0]["severity"] == "critical"


def evals(values: list[float], train_from: float, every: int = 20) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for n, value in enumerate(values):
        records += [step(n * every + i, loss=train_from * 0.9**n) for i in range(every)]
        records.append({"kind": "eval", "step": n * every + every - 1, "val_loss": value, "training": False})
    return records


def test_overfit_fires_when_eval_rises_while_train_falls_and_clears_on_a_new_best():
    overfitting = evals([1.0, 0.8, 0.7, 0.75, 0.8, 0.9, 0.95, 0.6], train_from=1.0)
    assert fired(overfitting, "overfit") == [("overfit", 119, "warning"), ("overfit", 159, "info")]
    noisy = evals([1.0, 0.8, 0.85, 0.7, 0.72, 0.69, 0.71, 0.68], train_from=1.0)
    assert fired(noisy, "overfit") == []


def test_overfit_is_quiet_when_the_training_loss_only_wanders():
    # A constant-lr plateau: per-batch losses around 0.31 (sd 0.1), the eval loss wandering 0.32-0.38.
    rng = random.Random(2)  # noqa: S311 - reproducible noise, not a secret
    records: list[dict[str, Any]] = []
    for k, value in enumerate([0.36, 0.36, 0.35, 0.38, 0.37, 0.37, 0.323, 0.332, 0.358, 0.38]):
        records += [step(100 * k + i, loss=0.315 - 0.0007 * k + rng.gauss(0, 0.1)) for i in range(100)]
        records.append({"kind": "eval", "t": 0.0, "step": 100 * k + 99, "val_loss": value})
    assert fired(records, "overfit") == []


def test_straggler_names_the_slow_rank():
    records = [step(i, rank=r, compute_s=0.05 if r == 2 else 0.01) for i in range(30) for r in range(4)]
    alerts = Diagnosis(["straggler"]).run(records)
    assert [(a["evidence"]["rank"], a["step"]) for a in alerts] == [(2, 19)]


def ddp_step(i: int, rank: int, wait: float, forward: float, backward: float) -> dict[str, Any]:
    """A DDP rank's step: its total is wait + forward + backward + 1 ms of optimizer."""
    return step(
        i, rank=rank, data_wait_s=wait, compute_s=forward + backward + 0.001,
        forward_s=forward, backward_s=backward, optimizer_s=0.001,
    )  # fmt: skip


def test_straggler_names_the_rank_the_others_wait_for_and_its_cause_under_ddp():
    # Every rank's step takes 24 ms (the all-reduce evens them out); the others wait inside their backward.
    slow_input = [
        ddp_step(i, r, *((0.020, 0.002, 0.001) if r == 1 else (0.0002, 0.002, 0.0208)))
        for i in range(40)
        for r in range(4)
    ]
    alerts = Diagnosis(["straggler"]).run(slow_input)
    assert [(a["evidence"]["rank"], a["evidence"]["cause"], a["step"]) for a in alerts] == [(1, "input", 19)]
    assert alerts[0]["evidence"]["gap_s"] == pytest.approx(0.0198)
    assert set(alerts[0]["evidence"]["phase_medians"]) == {"0", "1", "2", "3"}
    assert "rank 1 makes the other ranks wait 19.8 ms a step" in alerts[0]["message"]
    # A slow forward on rank 2: the others wait at the all-reduce, their forward + backward equal its own.
    slow_forward = [
        ddp_step(i, r, 0.0002, *((0.018, 0.001) if r == 2 else (0.002, 0.017))) for i in range(40) for r in range(4)
    ]
    alerts = Diagnosis(["straggler"]).run(slow_forward)
    assert [(a["evidence"]["rank"], a["evidence"]["cause"]) for a in alerts] == [(2, "compute")]
    # With batch norm, DDP also syncs at the forward's start: a slow loader's victims wait there, in forward_s.
    buffered = [
        ddp_step(i, r, *((0.020, 0.002, 0.005) if r == 0 else (0.0002, 0.0218, 0.005)))
        for i in range(40)
        for r in range(2)
    ]
    alerts = Diagnosis(["straggler"]).run(buffered)
    assert [(a["evidence"]["rank"], a["evidence"]["cause"]) for a in alerts] == [(0, "input")]


def test_straggler_is_quiet_on_healthy_ranks_and_names_no_cause_the_phases_do_not_show():
    rng = random.Random(6)  # noqa: S311 - reproducible noise, not a secret
    healthy = [
        ddp_step(i, r, 0.0002 * rng.uniform(0.5, 2), 0.002 * rng.uniform(0.8, 1.2), 0.02 * rng.uniform(0.8, 1.2))
        for i in range(300)
        for r in range(8)
    ]
    assert fired(healthy, "straggler") == []
    # The others wait 15 ms, but neither its data wait nor its forward is longer: the alert says so, no cause.
    unexplained = [ddp_step(i, r, 0.0002, 0.002, 0.001 if r == 3 else 0.016) for i in range(40) for r in range(4)]
    alerts = Diagnosis(["straggler"]).run(unexplained)
    assert [(a["evidence"]["rank"], a["evidence"]["cause"]) for a in alerts] == [(3, None)]
    assert "do not explain it" in alerts[0]["message"]


def test_docs_name_every_rule_and_threshold():
    text = (Path(__file__).parents[2] / "docs" / "rules.md").read_text()
    for rule_id in REGISTRY:
        assert f"| `{rule_id}` |" in text
        for name in thresholds(rule_id):
            assert f"`{name}`" in text, f"docs/rules.md does not document {rule_id}'s threshold {name}"


def test_loss_chance_waits_for_a_warm_up_and_says_what_it_assumed():
    chance = math.log(4)
    records = []
    for i in range(2400):
        lr = 0.1 * min(1.0, (i + 1) / 2000)  # a 2,000-step warm-up: the loss stays near chance through it
        records.append(step(i, loss=chance * (1.0 + 0.01 * ((i % 7) - 3)), lr=[lr], classes=4 if i == 0 else None))
    alerts = [a for a in Diagnosis(["loss-chance"]).run(records) if a["severity"] != "info"]
    assert [a["step"] for a in alerts] == [2099]  # 100 steps after the lr stopped rising
    evidence = alerts[0]["evidence"]
    assert evidence["classes"] == 4
    assert evidence["classes_from"].startswith("the model's output")
    assert evidence["schedule"] == "lr 0.1, not risen for 100 steps (peak 0.1)"


def test_loss_chance_is_quiet_when_the_class_count_is_unknown():
    records = [step(i, loss=math.log(4), lr=[0.1]) for i in range(500)]
    assert fired(records, "loss-chance") == []


def test_gradscaler_skips_are_info_until_too_many_in_a_row():
    ok = {"batch": True, "forward": True, "loss": True, "grad": True, "param": True}
    bad = ok | {"grad": False, "param": None}
    records = [step(0, finite=ok, opt_step=1, scale=65536.0)]
    records += [step(i, finite=bad, opt_step=None, scale=65536.0 / 2**i) for i in range(1, 3)]
    records += [step(3, finite=ok, opt_step=2, scale=16384.0)]
    records += [step(i, finite=bad, opt_step=None, scale=16384.0 / 2 ** (i - 3)) for i in range(4, 16)]
    alerts = Diagnosis(["nonfinite"]).run(records)
    assert [(a["step"], a["severity"]) for a in alerts] == [(1, "info"), (2, "info")] + [
        (i, "info") for i in range(4, 13)
    ] + [(13, "critical")]
    assert alerts[-1]["evidence"]["scaler_skips"] == 10
    assert alerts[-1]["message"].startswith("the GradScaler skipped 10 steps in a row (scale now 16)")


def test_a_reinforcement_learning_loop_turns_off_the_rules_its_rollouts_set_off_unless_the_config_names_them():
    off = {"loss-spike": False, "grad-explosion": False, "loss-chance": False}
    assert for_reinforcement_learning(None) == (off, ["loss-spike", "grad-explosion", "loss-chance"])
    assert for_reinforcement_learning({"data-bound": False}) == ({**off, "data-bound": False}, list(off))
    named = {"loss-spike": {"ratio": 20}, "grad-explosion": True, "loss-chance": {"classes": 4}}
    assert for_reinforcement_learning(named) == (named, [])
    assert for_reinforcement_learning({"loss-spike": True}) == (
        {"grad-explosion": False, "loss-chance": False, "loss-spike": True},
        ["grad-explosion", "loss-chance"],
    )
    assert for_reinforcement_learning(["nonfinite", "loss-spike"]) == (["nonfinite", "loss-spike"], [])
    ids = {r.id for r in Diagnosis(for_reinforcement_learning(None)[0]).rules}
    assert ids == set(REGISTRY) - set(off)
