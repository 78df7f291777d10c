"""``tuiwatch.lightning.TuiwatchCallback`` on a real Lightning Trainer: a LightningModule on synthetic data."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tuiwatch.ledger.chain import read_run
from tuiwatch.ledger.ranks import rank_ledgers

from ..helpers import SCRIPTS, env_for, ledger_file, records
from .keys import checkpoint_then_stop

pytest.importorskip("pytorch_lightning")
pytestmark = pytest.mark.integration

SCRIPT = SCRIPTS / "lightning_train.py"
STEPS_PER_EPOCH = 16  # 512 samples in batches of 32


def fit(
    tmp_path: Path, socket_dir: Path, *args: str, name: str = "runs", namespace: str = "pytorch_lightning"
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--root", str(tmp_path / "root"), "--run-dir", str(tmp_path / name), *args]
    env = {**env_for(socket_dir), "LIGHTNING_NAMESPACE": namespace}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("namespace", ["pytorch_lightning", "lightning.pytorch"])
def test_steps_hold_what_the_module_computed_with_accumulation_and_clipping(
    namespace: str, tmp_path: Path, socket_dir: Path
):
    pytest.importorskip(namespace)
    args = ("--accumulate", "2", "--clip", "1.0", "--truth", str(tmp_path / "t.json"))
    done = fit(tmp_path, socket_dir, *args, namespace=namespace)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"with {namespace}.Trainer" in done.stdout  # either namespace's Trainer takes the one callback
    truth = json.loads((tmp_path / "t.json").read_text())
    ledger = ledger_file(tmp_path / "runs")
    assert records(ledger, "run")[0]["model"] == "Classifier"
    steps = records(ledger, "step")
    assert len(steps) == len(truth["norms"]) == 2 * STEPS_PER_EPOCH // 2  # an optimizer step per 2 batches
    losses = truth["losses"]
    pairs = [a + b for a, b in zip(losses[::2], losses[1::2], strict=True)]
    assert [s["loss"] for s in steps] == pytest.approx(pairs, rel=1e-5)
    # The norm before clipping, measured at on_before_optimizer_step: Lightning's own grad_norm of the same moment.
    assert [s["grad_norm"] for s in steps] == pytest.approx(truth["norms"], rel=1e-5)
    assert [s["grad_norm_clipped"] for s in steps] == [n > 1.0 for n in truth["norms"]]
    assert [s["lr"] for s in steps] == [[0.1]] * 8 + [[0.05]] * 8  # the StepLR of configure_optimizers
    assert [s["epoch"] for s in steps] == [0] * 8 + [1] * 8
    assert all(s["micro_batches"] == 2 and s["batch_shape"] == [[32, 8], [32]] for s in steps)
    # Each step's sample ids (its two micro-batches'), from the loader's sampler: the samples it trained on.
    features = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))[:, 0]
    batches = [a + b for a, b in zip(truth["firsts"][::2], truth["firsts"][1::2], strict=True)]
    assert [features[s["batch_ids"]].tolist() for s in steps] == batches
    assert sorted(i for s in steps[:8] for i in s["batch_ids"]) == list(range(512))  # one shuffled epoch
    assert all(s["data_wait_s"] is not None and s["opt_step"] == s["step"] + 1 for s in steps)
    evals = records(ledger, "eval")  # the sanity check's validation is not one
    assert [e["step"] for e in evals] == [7, 15]
    assert [e["loss"] for e in evals] == pytest.approx(truth["val_losses"])
    assert all(e["training"] is False for e in evals)
    assert records(ledger, "end")[-1]["reason"] == "finished"


COMPILED_AS_ONE_GRAPH = """
import json, sys
import torch
from torch import nn
import pytorch_lightning as pl
from tuiwatch.lightning import TuiwatchCallback

class Module(pl.LightningModule):  # nothing in its steps breaks a graph: no self.log, no .item()
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
        self.losses = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
module = Module()
trainer = pl.Trainer(
    max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, callbacks=[TuiwatchCallback(run_dir=sys.argv[1], name="lit")],
)
trainer.fit(torch.compile(module, fullgraph=True, backend="eager"), torch.utils.data.DataLoader(data, batch_size=8))
json.dump([float(v) for v in module.losses], open(sys.argv[2], "w"))
"""


def test_a_step_has_its_phases_though_the_forward_runs_inside_the_optimizers_step(tmp_path: Path, socket_dir: Path):
    # Lightning runs training_step and the backward inside optimizer.step(closure), after the step's pre-hook: the
    # phases read a backward of 0 s and an update that held the whole step. The optimizer's own work now starts at
    # on_before_optimizer_step, after the backward.
    done = fit(tmp_path, socket_dir, "--epochs", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = records(ledger_file(tmp_path / "runs"), "step")
    assert len(steps) == STEPS_PER_EPOCH
    for s in steps:
        phases = (s["forward_s"], s["backward_s"], s["optimizer_s"])
        assert None not in phases
        assert s["backward_s"] > 0
        assert sum(phases) <= s["compute_s"] + 1e-6


def test_a_module_compiled_as_one_graph_trains_and_is_watched(tmp_path: Path, socket_dir: Path):
    # Lightning compiles the module again, with the user's options, after the callback hooked it: the hook's graph
    # break raised "Skip inlining `torch.compiler.disable()`d function" at the first step (docs/architecture.md).
    script, truth = tmp_path / "compiled.py", tmp_path / "losses.json"
    script.write_text(COMPILED_AS_ONE_GRAPH)
    cmd = [sys.executable, str(script), str(tmp_path / "runs"), str(truth)]
    done = subprocess.run(cmd, env=env_for(socket_dir), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = records(ledger_file(tmp_path / "runs"), "step")
    assert [s["step"] for s in steps] == list(range(8))
    assert [s["loss"] for s in steps] == pytest.approx(json.loads(truth.read_text()), rel=1e-6)
    assert all(s["grad_norm"] > 0 and s["opt_step"] == s["step"] + 1 for s in steps)


def test_a_planted_nan_stops_before_its_update_at_its_step(tmp_path: Path, socket_dir: Path):
    done = fit(tmp_path, socket_dir, "--nan-at", "5", "--truth", str(tmp_path / "t.json"))
    assert done.returncode != 0
    assert "NonFiniteError: nonfinite: first at step 5" in done.stderr
    assert json.loads((tmp_path / "t.json").read_text())["global_step"] == 5  # the bad update was not taken
    ledger = ledger_file(tmp_path / "runs")
    last = records(ledger, "step")[-1]
    assert last["step"] == 5
    assert last["opt_skipped"] is True
    assert last["finite"]["forward"] is False
    assert [(a["rule"], a["step"]) for a in records(ledger, "alert")] == [("nonfinite", 5)]
    assert records(ledger, "end")[-1]["reason"] == "nonfinite"


def test_with_skip_a_planted_nan_skips_that_update_and_training_goes_on(tmp_path: Path, socket_dir: Path):
    done = fit(tmp_path, socket_dir, "--nan-at", "5", "--on-nonfinite", "skip", "--truth", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    truth = json.loads((tmp_path / "t.json").read_text())
    assert truth["finite"]  # the NaN gradients never reached the weights
    steps = records(ledger_file(tmp_path / "runs"), "step")
    # Lightning still counts the skipped step (its optimizer.step ran, on no gradients); the ledger says it was skipped.
    assert [s["step"] for s in steps] == list(range(2 * STEPS_PER_EPOCH))
    assert [s["step"] for s in steps if s.get("opt_skipped")] == [5]
    assert steps[5]["opt_step"] is None
    assert steps[6]["opt_step"] == 6  # the optimizer steps counted are the updates made
    assert records(ledger_file(tmp_path / "runs"), "end")[-1]["reason"] == "finished"


def test_c_saves_a_lightning_checkpoint_that_fit_resumes_and_s_stops(tmp_path: Path, socket_dir: Path):
    cmd = [sys.executable, str(SCRIPT), "--root", str(tmp_path / "root"), "--run-dir", str(tmp_path / "runs")]
    done = checkpoint_then_stop([*cmd, "--epochs", "1000"], socket_dir)
    saved, stopped, out = done.saved, done.stopped, done.out
    assert done.returncode == 0, done.err[-3000:]
    assert saved["ok"], saved
    assert stopped["ok"], stopped
    checkpoint = Path(saved["path"])
    assert checkpoint.name == f"lightning-step-{saved['steps_done']}.ckpt"
    assert checkpoint.is_file()
    stopped_at = int(out.split("trained to step ")[1].split()[0])
    assert stopped_at == stopped["steps_done"] < 1000 * STEPS_PER_EPOCH  # s: after its step, no further one
    assert records(ledger_file(tmp_path / "runs"), "end")[-1]["reason"] == "stopped"

    # Trainer.fit(ckpt_path=...) continues from the step c saved at, to the end of the next epoch.
    resumed = fit(tmp_path, socket_dir, "--resume", str(checkpoint), "--epochs", "2", name="resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "trained to step 32 with" in resumed.stdout
    resumed_ledger = ledger_file(tmp_path / "resumed")
    at = saved["steps_done"]
    assert [s["step"] for s in records(resumed_ledger, "step")] == list(range(at, 32))  # numbered on from c's step
    link = records(resumed_ledger, "resumed")[0]["resumed_from"]
    assert (link["step"], link["checkpoint"]) == (at, str(checkpoint))
    assert Path(link["ledger"]).resolve() == ledger_file(tmp_path / "runs").resolve()  # named in Lightning's file
    # report reads the two ledgers as one run: the first up to c's step, then the resumed one.
    assert [r["step"] for r in read_run(resumed_ledger).records if r["kind"] == "step"] == list(range(32))


def test_the_ddp_strategys_ranks_are_one_job_with_the_same_reduced_gradients(tmp_path: Path, socket_dir: Path):
    done = fit(tmp_path, socket_dir, "--devices", "2", "--checkpoint-dir", str(tmp_path / "checkpoints"))
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = (tmp_path / "runs").iterdir()  # Lightning's launcher starts rank 1 itself: one job all the same
    ledgers = rank_ledgers(job)
    assert sorted(ledgers) == [0, 1]
    runs = [records(ledgers[r], "run")[0] for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in runs] == [(0, 2), (1, 2)]
    assert runs[0]["run_id"] == runs[1]["run_id"]
    steps = [records(ledgers[r], "step") for r in (0, 1)]
    assert [len(s) for s in steps] == [STEPS_PER_EPOCH, STEPS_PER_EPOCH]  # each rank half the data, 2 epochs
    # After DDP's all-reduce both ranks hold the same gradients: the same pre-clip norms, step by step.
    assert [s["grad_norm"] for s in steps[0]] == pytest.approx([s["grad_norm"] for s in steps[1]], rel=1e-6)
    # Under DDP Lightning runs training_step through the model's forward (its forward redirection), which calls the
    # forward again inside: two forwards a step, so no phases (the straggler rule compares step times).
    assert {(s["forward_s"], s["backward_s"], s["optimizer_s"]) for s in steps[0] + steps[1]} == {(None, None, None)}
    # Each rank's ids from the DistributedSampler Lightning put in: an epoch's two halves, apart.
    halves = [[i for s in steps[r][: STEPS_PER_EPOCH // 2] for i in s["batch_ids"]] for r in (0, 1)]
    assert sorted(halves[0] + halves[1]) == list(range(512))

    # Resumed from the first epoch's ModelCheckpoint, which holds rank 0's state only: each rank numbers its steps
    # on from the checkpoint's step and links to its own ledger of the first job, and reads as one run with it.
    first_epoch = tmp_path / "checkpoints" / f"epoch=0-step={STEPS_PER_EPOCH // 2}.ckpt"
    again = fit(tmp_path, socket_dir, "--devices", "2", "--resume", str(first_epoch), name="resumed")
    assert again.returncode == 0, again.stderr[-3000:]
    (resumed_job,) = (tmp_path / "resumed").iterdir()
    resumed = rank_ledgers(resumed_job)
    assert sorted(resumed) == [0, 1]
    for rank, ledger in resumed.items():
        assert [s["step"] for s in records(ledger, "step")] == list(range(STEPS_PER_EPOCH // 2, STEPS_PER_EPOCH))
        link = records(ledger, "resumed")[0]["resumed_from"]
        assert (link["step"], link["checkpoint"]) == (STEPS_PER_EPOCH // 2, str(first_epoch))
        assert Path(link["ledger"]).resolve() == ledgers[rank].resolve()
        assert [r["step"] for r in read_run(ledger).records if r["kind"] == "step"] == list(range(STEPS_PER_EPOCH))


def test_an_lbfgs_step_records_its_first_closure_evaluation(tmp_path: Path, socket_dir: Path):
    """Lightning hands LBFGS a closure that runs training_step, the backward and on_before_optimizer_step; LBFGS
    calls it up to max_iter times a step. The step's loss and norm are the first call's, at the step's weights
    (the loss was the last call's, the norm the first's)."""
    done = fit(tmp_path, socket_dir, "--lbfgs", "--epochs", "1", "--truth", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    truth = json.loads((tmp_path / "t.json").read_text())
    assert len(truth["losses"]) > len(set(truth["loss_steps"]))  # several evaluations in some steps

    def first_of_each_step(values: list[float], steps: list[int]) -> list[float]:
        return [v for i, (v, s) in enumerate(zip(values, steps, strict=True)) if i == 0 or steps[i - 1] != s]

    steps = records(ledger_file(tmp_path / "runs"), "step")
    assert len(steps) == STEPS_PER_EPOCH
    assert [s["loss"] for s in steps] == pytest.approx(first_of_each_step(truth["losses"], truth["loss_steps"]))
    assert [s["grad_norm"] for s in steps] == pytest.approx(
        first_of_each_step(truth["norms"], truth["norm_steps"]), rel=1e-5
    )


def test_manual_optimization_with_muon_and_adamw_records_both_optimizers_steps(tmp_path: Path, socket_dir: Path):
    """Two optimizers stepping one module (manual optimization): the lr of both, the update of both. The first
    optimizer alone was watched: the update norm was AdamW's, over the biases only."""
    done = fit(tmp_path, socket_dir, "--muon", "--epochs", "1", "--truth", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    truth = json.loads((tmp_path / "t.json").read_text())
    ledger = ledger_file(tmp_path / "runs")
    steps = records(ledger, "step")
    assert [s["step"] for s in steps] == list(range(STEPS_PER_EPOCH))
    assert [s["opt_step"] for s in steps] == list(range(1, STEPS_PER_EPOCH + 1))
    assert all(s["lr"] == [1e-3, 0.02] for s in steps)
    assert [s["loss"] for s in steps] == pytest.approx(truth["losses"])
    sampled = [(s["step"], s["update_norm"]) for s in steps if s["update_norm"] is not None]
    assert sampled == [(0, pytest.approx(truth["updates"][0], rel=1e-5)), (10, pytest.approx(truth["updates"][10]))]
    assert records(ledger, "run")[0]["optimizer"] == "AdamW + Muon"


def test_a_batchs_ids_are_the_recorders_oldest_when_their_count_is_its_size():
    from tuiwatch.integrations.lightning import TuiwatchCallback
    from tuiwatch.publisher.loader import IndexRecorder

    @dataclasses.dataclass
    class Pairs:  # a batch class of one's own, which Lightning moves to the device field by field
        x: torch.Tensor
        y: torch.Tensor

    hooks = TuiwatchCallback()
    hooks._ids = IndexRecorder([[0, 1], [2, 3], [7, 8], [9, 10], [11, 12], [4, 5, 6]])
    list(hooks._ids)  # drawn ahead, as Lightning's fetcher does
    assert hooks._batch_ids((torch.zeros(2, 3), torch.zeros(2))) == [0, 1]
    assert hooks._batch_ids({"input_ids": torch.zeros(2, 5), "labels": torch.zeros(2)}) == [2, 3]
    assert hooks._batch_ids(Pairs(torch.zeros(2, 3), torch.zeros(2))) == [7, 8]
    # torchvision's detection collate: a tuple of two (3, H, W) images and one of their targets (no ids before:
    # the first tensor's first dimension is an image's channels)
    images = (torch.zeros(3, 4, 4), torch.zeros(3, 4, 4))
    assert hooks._batch_ids((images, ({"boxes": torch.zeros(1, 4)},) * 2)) == [9, 10]
    ragged = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])  # no shape to read: it raised here
    assert hooks._batch_ids(ragged) is None
    assert hooks._batch_ids(torch.zeros(2, 3)) is None  # 3 ids for 2 rows: another batch's, so none
    assert hooks._batch_ids(torch.zeros(2, 3)) is None  # none left


STATEFUL_LOADER = """
import glob, json, sys
import torch
from torch import nn
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader
from tuiwatch.lightning import TuiwatchCallback

data = torch.utils.data.TensorDataset(torch.arange(96).float().unsqueeze(1), torch.zeros(96, dtype=torch.long))
drawn = []

class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(1, 2)

    def training_step(self, batch, batch_idx):
        drawn.append([int(v) for v in batch[0][:, 0]])
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return StatefulDataLoader(data, batch_size=8, shuffle=True)

run_dir, phase = sys.argv[1], sys.argv[2]
pl.seed_everything(0)
callbacks = [TuiwatchCallback(run_dir=run_dir, name=phase, quiet=True)]
options = dict(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
if phase == "first":  # a checkpoint in mid-epoch, after the fifth step
    callbacks.append(ModelCheckpoint(dirpath=run_dir + "/ck", every_n_train_steps=5, save_top_k=-1))
    pl.Trainer(callbacks=callbacks, **options).fit(Module())
else:
    path = sorted(glob.glob(run_dir + "/ck/*step=5*.ckpt"))[0]
    pl.Trainer(callbacks=callbacks, enable_checkpointing=False, **options).fit(Module(), ckpt_path=path)
json.dump(drawn, open(run_dir + "/" + phase + ".json", "w"))
"""


def test_a_stateful_loader_resumed_mid_epoch_draws_the_rest_of_its_epoch_each_step_with_its_ids(
    tmp_path: Path, socket_dir: Path
):
    # torchdata's StatefulDataLoader, which Lightning saves in its checkpoints and restores with ckpt_path, makes its
    # iterator in an __iter__ of its own: the recorder, put in at DataLoader.__iter__, never stood in, and no step
    # had ids.
    pytest.importorskip("torchdata")
    script = tmp_path / "stateful.py"
    script.write_text(STATEFUL_LOADER)
    drawn = {}
    for phase in ("first", "resumed"):
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path), phase],
            env=env_for(socket_dir),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        drawn[phase] = json.loads((tmp_path / f"{phase}.json").read_text())
        (ledger,) = [p for p in tmp_path.glob(f"{phase}-*/ledger.jsonl")]
        assert [s["batch_ids"] for s in records(ledger, "step")] == drawn[phase]
    assert len(drawn["first"]) == 12
    assert drawn["resumed"] == drawn["first"][5:]
