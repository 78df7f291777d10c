"""Every demo fault, trained for real on the CPU: the expected rule names it, soon, with its evidence."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

import tuiwatch
from tuiwatch.demo.faults import FAULTS, scenario
from tuiwatch.demo.healthy import VARIANTS
from tuiwatch.demo.loop import Outcome
from tuiwatch.demo.matrix import HEALTHY_STEPS, SEEDS, healthy_row
from tuiwatch.demo.problems import MODELS
from tuiwatch.ledger.records import Record
from tuiwatch.publisher.dumps import Dump

pytestmark = pytest.mark.integration  # every fault and the healthy matrix train for real

# fault → (steps to run, the step the fault begins (None: when the planted sample is drawn), most steps to detect)
EXPECTED: dict[str, tuple[int, int | None, int]] = {
    "nan-input": (200, None, 0),
    "log-zero": (200, None, 0),
    "big-lr": (300, 60, 5),
    "numpy-graph": (60, 0, 4),
    "optimizer-copy": (60, 0, 20),
    "lr-collapse": (400, 0, 280),
    "shuffled-labels": (300, 0, 199),
    "slow-loader": (80, 0, 49),
    "kept-graphs": (1500, 0, 1500),
    "long-sequence": (60, 20, 0),
    "overfit": (1000, 0, 600),
    "eval-train-mode": (150, 99, 0),
    "corrupt-batch": (100, 50, 0),
}


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch's thread pool spin-waits at each op: beside other jobs on 2 cores, a 1 ms step of the tiny MLP
    then takes 50 ms of wall time at random, which no timing rule can be judged by. One thread is steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(name: str, run_root: Path) -> tuple[Outcome, list[Record]]:
    outcome = scenario(name).run(steps=EXPECTED[name][0], run_dir=run_root)
    return outcome, list(tuiwatch.read_ledger(outcome.watch.run_dir or ""))


def dump_at(path: str | Path) -> Dump:
    dump = tuiwatch.load_dump(path)
    assert isinstance(dump, Dump)
    return dump


def alerts(ledger: Sequence[Record], rule: str) -> list[Record]:
    return [r for r in ledger if r["kind"] == "alert" and r["rule"] == rule and r["severity"] != "info"]


def first_step_with(ledger: list[Record], sample: int) -> int:
    return int(next(r["step"] for r in ledger if r["kind"] == "step" and sample in (r["batch_ids"] or [])))


def test_every_fault_has_a_scenario_and_an_expectation():
    assert set(EXPECTED) == set(FAULTS)
    from tuiwatch.cli.demo import FAULT_NAMES

    assert set(FAULT_NAMES) == set(FAULTS)


@pytest.mark.timeout(600)  # kept-graphs trains 1,500 steps: ~15 s idle, 45 s beside two CPU hogs
@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_expected_rule_names_the_fault_soon(name: str, run_root: Path, socket_dir: Path):
    _outcome, ledger = run(name, run_root)
    module = scenario(name)
    found = alerts(ledger, module.RULE)
    assert found, (
        f"{module.RULE} did not fire; alerts: {[(a['rule'], a['step']) for a in ledger if a['kind'] == 'alert']}"
    )
    _, starts, within = EXPECTED[name]
    if starts is None:
        starts = first_step_with(ledger, module.SAMPLE)
    assert starts <= found[0]["step"] <= starts + within
    assert found[0]["next_check"]


def test_nan_input_stops_before_the_update_with_a_dump_of_the_batch_and_healthy_weights(
    run_root: Path, socket_dir: Path
):
    outcome, ledger = run("nan-input", run_root)
    error = outcome.error
    assert isinstance(error, tuiwatch.NonFiniteError)
    bad_step = first_step_with(ledger, 1234)
    assert (error.step, error.boundary) == (bad_step, "batch")
    assert error.dump is not None
    assert f"dump: {error.dump}" in str(error)
    (alert,) = alerts(ledger, "nonfinite")
    assert 1234 in alert["evidence"]["batch_ids"]
    assert alert["evidence"]["dump"] == error.dump
    assert alert["evidence"]["nonfinite_sample_ids"] == [1234]  # the alert names the bad sample, not only the dump
    assert ledger[-1]["kind"] == "end"
    assert ledger[-1]["reason"] == "nonfinite"

    dump = dump_at(error.dump)
    assert Path(error.dump).name == f"{bad_step}-nonfinite"
    assert (dump.reason, dump.step) == ("nonfinite", bad_step)
    assert 1234 in (dump.batch_ids or [])
    x, _ = dump.batch
    row = (dump.batch_ids or []).index(1234)
    assert math.isnan(x[row, 1].item())
    assert torch.isfinite(x[:row]).all()
    assert dump.weights is not None
    assert all(torch.isfinite(w).all() for w in dump.weights.values())
    # the weights are the model's now: the bad update never happened
    model = outcome.watch.model
    assert all(torch.equal(dump.weights[k], v) for k, v in model.state_dict().items())
    assert dump.records[-1]["step"] == bad_step
    assert dump.env["seed"] == 0
    assert dump.env["torch"] == torch.__version__
    assert "deterministic_algorithms" in dump.env
    assert (Path(error.dump) / "dump.json").read_text().count('"nonfinite_sample_ids": [\n  1234\n ]') == 1
    site = tuiwatch.first_nonfinite_module(model, dump.batch)
    assert (site.batch_finite, site.input_module, site.module) == (False, "", "0")


def test_log_zero_is_named_at_the_loss_not_the_model(run_root: Path, socket_dir: Path):
    outcome, ledger = run("log-zero", run_root)
    assert isinstance(outcome.error, tuiwatch.NonFiniteError)
    assert outcome.error.boundary == "loss"
    (alert,) = alerts(ledger, "nonfinite")
    assert alert["evidence"]["failed"][0] == "loss"
    assert outcome.error.dump is not None
    site = tuiwatch.first_nonfinite_module(outcome.watch.model, dump_at(outcome.error.dump).batch)
    assert site.module is None
    assert site.batch_finite


def test_a_spike_dumps_its_batch_and_names_its_ids(run_root: Path, socket_dir: Path):
    # The dump is written on the publisher thread; the batch is still held while fewer than 32 steps passed.
    outcome = scenario("corrupt-batch").run(steps=100, run_dir=run_root, delay_s=0.002)
    ledger = list(tuiwatch.read_ledger(outcome.watch.run_dir or ""))
    alert = alerts(ledger, "loss-spike")[0]
    assert alert["evidence"]["batch_ids"] == list(range(3200, 3264))
    dump = dump_at(alert["evidence"]["dump"])
    assert Path(alert["evidence"]["dump"]).name == "50-loss-spike"
    assert dump.batch_ids == list(range(3200, 3264))
    assert dump.weights is None  # only a non-finite stop keeps weights
    assert dump.batch[0].abs().max() > 100


def test_an_oom_is_recorded_and_the_original_exception_goes_on(run_root: Path, socket_dir: Path):
    outcome, ledger = run("long-sequence", run_root)
    assert isinstance(outcome.error, RuntimeError)
    assert "can't allocate memory" in str(outcome.error)
    (alert,) = alerts(ledger, "oom")
    assert alert["step"] == 20
    assert alert["evidence"]["batch_shape"] == [[2, 524288, 8], [2]]
    assert alert["evidence"]["rss"] > 0
    assert alert["message"].startswith("out of memory at step 20 with batch [[2, 524288, 8], [2]]")
    assert dump_at(alert["evidence"]["dump"]).batch[0].shape == (2, 524288, 8)
    steps = [r for r in ledger if r["kind"] == "step"]
    assert steps[-1]["oom"]["error"] == "RuntimeError"


class PlantedNaN(nn.Module):
    """A layer that goes wrong: log of its input, which the ReLU before it leaves at exactly 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x) * 0.0


def test_first_nonfinite_module_names_the_planted_layer():
    first, inner = nn.Linear(4, 8), nn.Linear(8, 8)
    model = nn.Sequential(first, nn.ReLU(), nn.Sequential(inner, PlantedNaN()), nn.Linear(8, 2))
    with torch.no_grad():
        first.weight.fill_(-1.0)
        first.bias.fill_(0.0)
        inner.weight.fill_(1.0)
    site = tuiwatch.first_nonfinite_module(model, (torch.ones(3, 4), torch.zeros(3)))
    assert (site.module, site.module_type) == ("2.1", "PlantedNaN")
    assert site.input_module == "3"
    assert site.batch_finite
    assert not site.output_finite
    assert str(site) == "first non-finite output: 2.1 (PlantedNaN)"
    healthy = tuiwatch.first_nonfinite_module(nn.Linear(4, 2), torch.ones(3, 4))
    assert healthy.module is None
    assert str(healthy) == "every module's output is finite on this batch"


def test_a_missing_dump_is_a_one_line_error(tmp_path: Path):
    with pytest.raises(tuiwatch.TuiwatchError, match=r"is not a tuiwatch dump \(no dump.json\)"):
        tuiwatch.load_dump(tmp_path)


def test_a_hostile_dump_is_a_one_line_error_read_in_bounded_memory(tmp_path: Path):
    meta = tmp_path / "dump.json"
    with open(meta, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB without a newline (sparse): read no further than the limit
    with pytest.raises(tuiwatch.TuiwatchError, match=r"dump.json is over 16384 KiB: not a file tuiwatch wrote"):
        tuiwatch.load_dump(tmp_path)
    meta.write_bytes(b'{"files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(tuiwatch.TuiwatchError, match=r"^cannot read .*dump.json: RecursionError"):
        tuiwatch.load_dump(tmp_path)
    meta.write_bytes(b"[1, 2]")
    with pytest.raises(tuiwatch.TuiwatchError, match=r"dump.json: not a JSON object$"):
        tuiwatch.load_dump(tmp_path)
    meta.write_bytes(b'{"step": 1e999, "files": ["../../etc/passwd", 7], "reason": "alert"}')
    dump = tuiwatch.load_dump(tmp_path)
    assert isinstance(dump, Dump)
    assert (dump.step, dump.files, dump.batch) == (-1, ["../../etc/passwd"], None)


# 1,000 steps each: ~10 s on an idle 2-core machine, 40-120 s beside two CPU hogs.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", list(SEEDS))
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("model", list(MODELS))
def test_healthy_runs_raise_no_warning_or_critical_alert(
    model: str, variant: str, seed: int, tmp_path: Path, socket_dir: Path
):
    row = healthy_row(model, variant, seed, tmp_path)
    assert row.steps == HEALTHY_STEPS
    assert row.alerts == []


class RaisesCudaOom(nn.Module):
    """What a CUDA allocation failure looks like to Python (this machine has no GPU to fill)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_a_cuda_oom_error_is_recorded_the_same_way_and_reraised_unchanged(run_root: Path, socket_dir: Path):
    model = RaisesCudaOom()
    watch = tuiwatch.Watch(model, None, run_dir=run_root, system=False)
    raised = None
    try:
        for x in watch.batches([torch.ones(4, 8)]):
            model(x)
    except torch.OutOfMemoryError as exc:
        raised = exc
    watch.close()
    assert str(raised) == "CUDA out of memory. Tried to allocate 20.00 GiB"
    (alert,) = alerts(list(tuiwatch.read_ledger(watch.run_dir or "")), "oom")
    assert alert["evidence"]["error"] == "OutOfMemoryError"
    assert alert["evidence"]["batch_shape"] == [4, 8]
    assert Path(alert["evidence"]["dump"]).name == "0-oom"
