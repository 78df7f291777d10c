"""``diff``'s reasoning on small ledgers: setup first, common steps only, causes the evidence supports."""

from __future__ import annotations

from typing import Any

from tuiwatch.analysis.diff import FIELDS, as_text, compare, options


def run(**fields: Any) -> dict[str, Any]:
    base = {"kind": "run", "t": 0.0, "run_id": "a", "argv": ["train.py"], "seed": 0, "torch": "2.13.0"}
    return base | {"device": "cpu", "model": "MLP"} | fields


def step(i: int, **fields: Any) -> dict[str, Any]:
    base = {"kind": "step", "t": 1.0 + i, "step": i, "loss": 1.0 / (i + 1), "grad_norm": 0.5, "lr": [0.1]}
    return base | {"param_norm": 3.0, "batch_ids": None} | fields


def test_the_setup_is_compared_first_by_command_line_option():
    a = [run(argv=["train.py", "--dtype", "float32", "--steps=100"]), step(0)]
    b = [run(run_id="b", argv=["/elsewhere/train.py", "--dtype", "bfloat16", "--steps=100", "--compile"]), step(0)]
    found = compare(a, b)
    assert found.setup == [("--compile", None, True), ("--dtype", "float32", "bfloat16")]
    text = as_text(found, FIELDS)
    assert "setup      the runs differ in --compile: A=None B=True, --dtype: A='float32' B='bfloat16'" in text
    assert found.identical  # the one common step agrees


def test_options_reads_flags_values_and_negative_numbers():
    argv = ["x.py", "data", "--lr", "-0.5", "--fast", "-v", "--n=3"]
    assert options(argv) == {"#0": "data", "--lr": "-0.5", "--fast": True, "-v": True, "--n": "3"}


def test_only_common_steps_are_compared_and_counted():
    a = [run(), *(step(i) for i in range(120))]
    b = [run(run_id="b"), *(step(i) for i in range(85, 120))]
    found = compare(a, b)
    assert found.identical
    assert (found.steps_a, found.steps_b, len(found.common)) == (120, 35, 35)
    first = as_text(found, FIELDS).splitlines()[0]
    assert first == "steps      A has 120, B has 35; 35 in common (85-119) are compared"


def test_no_common_step_is_not_identical():
    found = compare([run(), step(0)], [run(run_id="b"), step(5)])
    assert not found.identical
    assert "no step in common: nothing to compare" in as_text(found, FIELDS)


def test_without_batch_ids_a_loss_difference_never_claims_the_same_batches():
    a = [run(), step(0), step(1)]
    b = [run(run_id="b"), step(0), step(1, loss=9.0)]
    found = compare(a, b)
    assert found.difference is not None
    assert (found.difference.step, found.difference.field) == (1, "loss")
    assert "same batches" not in found.difference.meaning
    assert "no batch ids to tell whether the batches were the same" in found.difference.meaning
    assert found.unchecked == ["batch_ids"]


def test_with_agreeing_batch_ids_a_loss_difference_says_same_batches():
    a = [run(), step(0, batch_ids=[1, 2])]
    b = [run(run_id="b"), step(0, batch_ids=[1, 2], loss=9.0)]
    found = compare(a, b)
    assert found.difference is not None
    assert found.difference.meaning.startswith("same batches, different loss")


def test_gpu_kernels_are_blamed_only_for_a_run_on_a_gpu():
    cpu = compare([run(), step(0)], [run(run_id="b"), step(0, grad_norm=0.6)])
    assert cpu.difference is not None
    assert "cuDNN" not in cpu.difference.meaning
    assert "thread count" in cpu.difference.meaning
    gpu = compare([run(device="cuda:0"), step(0)], [run(run_id="b", device="cuda:0"), step(0, grad_norm=0.6)])
    assert gpu.difference is not None
    assert "cuDNN" in gpu.difference.meaning


def test_a_setup_difference_leads_the_explanation():
    a = [run(), step(0)]
    b = [run(run_id="b", torch="2.12.0"), step(0, loss=2.0)]
    found = compare(a, b)
    assert found.difference is not None
    assert found.difference.meaning.startswith("the runs were set up differently (torch): start there; ")
