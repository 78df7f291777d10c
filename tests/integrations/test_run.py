"""``tuiwatch run``: an unmodified copy of pytorch/examples' mnist script (synthetic data), run as python runs it."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuiwatch.integrations.script import ModelOfParts, parts_of_the_same_backward, same_backward_elsewhere, steps_beside
from tuiwatch.ledger.ranks import rank_ledgers
from tuiwatch.ledger.records import Record

from ..helpers import SCRIPTS, env_for, ledger_file, records
from .keys import checkpoint_then_stop

pytestmark = pytest.mark.integration

SCRIPT = SCRIPTS / "mnist_synthetic.py"
TUIWATCH = [sys.executable, "-m", "tuiwatch", "run"]
BATCHES = 20  # 640 samples in batches of 32


def run(cmd: list[str], socket_dir: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env_for(socket_dir), capture_output=True, text=True, timeout=120, cwd=cwd)


def watched(run_root: Path, socket_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([*TUIWATCH, "--run-dir", str(run_root), str(SCRIPT), *args], socket_dir)


def run_written(
    source: str, tmp_path: Path, socket_dir: Path, *args: str, options: tuple[str, ...] = (), runs: str = "runs"
) -> subprocess.CompletedProcess[str]:
    """``source`` written as a script and run under ``tuiwatch run`` with ``args``, its ledgers under ``runs``."""
    script = tmp_path / "script.py"
    script.write_text(source)
    return run([*TUIWATCH, "--run-dir", str(tmp_path / runs), *options, str(script), *args], socket_dir)


def run_source(
    source: str, tmp_path: Path, socket_dir: Path, *args: str, options: tuple[str, ...] = (), runs: str = "runs"
) -> Path:
    """``source`` written as a script and run under ``tuiwatch run`` with ``args``; it must succeed: its ledger."""
    done = run_written(source, tmp_path, socket_dir, *args, options=options, runs=runs)
    assert done.returncode == 0, done.stderr
    return ledger_file(tmp_path / runs)


def test_the_script_prints_and_exits_as_under_python_and_the_ledger_has_every_step(
    run_root: Path, socket_dir: Path, tmp_path: Path
):
    plain = run([sys.executable, str(SCRIPT), "--epochs", "2"], socket_dir)
    done = watched(run_root, socket_dir, "--epochs", "2", "--truth", str(tmp_path / "truth.json"))
    assert (done.returncode, plain.returncode) == (0, 0), done.stderr
    assert done.stdout == plain.stdout  # the script's own output, untouched
    assert "Test set: Average loss" in done.stdout

    ledger = ledger_file(run_root)
    run_record = records(ledger, "run")[0]
    assert run_record["argv"][1:] == ["--epochs", "2", "--truth", str(tmp_path / "truth.json")]
    assert run_record["model"] == "Net"
    assert run_record["optimizer"] == "Adadelta"
    assert run_record["integration"]["by"] == "tuiwatch run"
    assert run_record["integration"]["not_seen"]
    steps = records(ledger, "step")
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert [s["step"] for s in steps] == list(range(2 * BATCHES))  # the test loader's batches are not steps
    assert [s["loss"] for s in steps] == pytest.approx(truth, rel=1e-6)  # the scalar backward() ran on
    assert [s["epoch"] for s in steps] == [0] * BATCHES + [1] * BATCHES
    assert [s["lr"] for s in steps] == [[1.0]] * BATCHES + [[pytest.approx(0.7)]] * BATCHES  # StepLR, per epoch
    assert all(s["grad_norm"] > 0 and s["opt_step"] == s["step"] + 1 for s in steps)
    assert all("micro_batches" not in s for s in steps)
    # Every training batch after the first (drawn before the first optimizer step found the model) is recorded.
    assert steps[0]["batch_ids"] is None
    assert all(s["batch_shape"] == [[32, 1, 16, 16], [32]] and s["data_wait_s"] >= 0 for s in steps[1:])
    second_epoch = [i for s in steps[BATCHES:] for i in s["batch_ids"]]
    assert sorted(second_epoch) == list(range(640))  # the shuffled epoch, each sample once
    assert records(ledger, "end")[-1]["reason"] == "finished"


def test_accumulation_under_a_grad_scaler_with_loader_workers(run_root: Path, socket_dir: Path, tmp_path: Path):
    args = ("--epochs", "1", "--accumulate", "2", "--amp", "--workers", "2", "--truth", str(tmp_path / "t.json"))
    done = watched(run_root, socket_dir, *args)
    assert done.returncode == 0, done.stderr
    steps = records(ledger_file(run_root), "step")
    truth = json.loads((tmp_path / "t.json").read_text())  # each micro-batch's loss, divided by 2 by the script
    assert len(steps) == BATCHES // 2
    # The loss the update descends: the two micro-batches' (unscaled) losses summed.
    assert [s["loss"] for s in steps] == pytest.approx(
        [a + b for a, b in zip(truth[::2], truth[1::2], strict=True)], rel=1e-5
    )
    assert all(s["micro_batches"] == 2 and len(s["batch_ids"]) == 64 for s in steps[1:])
    assert all(s["scale"] == 65536.0 for s in steps)  # the script's GradScaler, found


def test_a_script_that_raises_exits_1_with_its_own_traceback(run_root: Path, socket_dir: Path):
    done = watched(run_root, socket_dir, "--fail-at", "7")
    assert done.returncode == 1
    assert f'File "{SCRIPT}", line' in done.stderr
    assert done.stderr.rstrip().endswith("RuntimeError: a bug in the training script at batch 7")
    assert "runpy" not in done.stderr
    assert "integrations/script.py" not in done.stderr
    ledger = ledger_file(run_root)
    steps = records(ledger, "step")
    assert [s["opt_step"] for s in steps] == [1, 2, 3, 4, 5, 6, 7, None]  # the batch it failed on: drawn, not trained
    assert records(ledger, "end")[-1]["reason"] == "exception"


def test_the_exit_status_and_module_form_are_pythons(run_root: Path, socket_dir: Path):
    done = run(
        [*TUIWATCH, "--run-dir", str(run_root), "-m", "mnist_synthetic", "--exit-code", "3"], socket_dir, SCRIPTS
    )
    assert done.returncode == 3, done.stderr
    assert "Test set" in done.stdout
    ledger = ledger_file(run_root)
    assert len(records(ledger, "step")) == 2 * BATCHES
    assert records(ledger, "end")[-1]["reason"] == "exception"  # sys.exit(3): not a clean finish


def test_bad_targets_get_one_line(socket_dir: Path, tmp_path: Path):
    for args, says in (([], "run needs a script"), (["-m"], "needs a module name"), (["nope.py"], "no script at")):
        done = run([*TUIWATCH, *args], socket_dir, tmp_path)
        assert done.returncode == 1
        assert says in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_checkpoint_and_stop_keys_act_on_the_unedited_script(run_root: Path, socket_dir: Path):
    cmd = [*TUIWATCH, "--run-dir", str(run_root), str(SCRIPT), "--epochs", "1000"]
    done = checkpoint_then_stop(cmd, socket_dir, after_step=5)
    saved = done.saved
    assert saved["ok"]
    assert done.stopped["ok"]
    assert done.returncode == 0
    assert "a viewer asked the run to stop" in done.err
    assert "Train Epoch: 1" in done.out
    state = torch.load(saved["path"], weights_only=False)
    assert "conv1.weight" in state["model"]
    assert state["step"] >= 5
    assert "scheduler" in state
    assert state["scheduler"] is not None
    ledger = ledger_file(run_root)
    assert records(ledger, "end")[-1]["reason"] == "stopped"
    assert records(ledger, "step")[-1]["step"] < 1000 * BATCHES


def test_under_torchrun_each_rank_of_an_unedited_ddp_script_is_watched_as_one_job(tmp_path: Path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "tuiwatch", "run"]
    cmd = [*launcher, "--run-dir", str(tmp_path / "runs"), str(SCRIPTS / "ddp_plain.py")]
    done = run(cmd, tmp_path / "sock")
    assert done.returncode == 0, done.stderr[-2000:]
    # Each rank's own print (torchrun interleaves the two ranks' writes: print writes the line, then its newline).
    assert "rank 0 of 2 done" in done.stdout
    assert "rank 1 of 2 done" in done.stdout
    (job,) = (tmp_path / "runs").iterdir()
    ledgers = rank_ledgers(job)
    assert sorted(ledgers) == [0, 1]
    steps = {rank: records(path, "step") for rank, path in ledgers.items()}
    assert [len(s) for s in steps.values()] == [16, 16]  # 2 epochs of 256 samples a rank, 32 a batch
    assert records(ledgers[0], "run")[0]["model"] == "DistributedDataParallel"
    # After the all-reduce both ranks hold the same gradients: the same pre-clip norms, step by step.
    assert [s["grad_norm"] for s in steps[0]] == pytest.approx([s["grad_norm"] for s in steps[1]], rel=1e-6)
    for epoch in (0, 1):  # each epoch the two shards together are the dataset once (the first batch unseen)
        ids = [i for r in (0, 1) for s in steps[r] if s["epoch"] == epoch and s["batch_ids"] for i in s["batch_ids"]]
        assert len(ids) == len(set(ids)) == (512 - 64 if epoch == 0 else 512)


def test_a_run_directory_that_cannot_be_made_leaves_the_script_running_unwatched(socket_dir: Path, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = run([*TUIWATCH, "--run-dir", str(blocker / "runs"), str(SCRIPT), "--epochs", "1"], socket_dir)
    assert done.returncode == 0
    assert "Test set: Average loss" in done.stdout
    assert "tuiwatch run: cannot watch this run (" in done.stderr
    assert "it runs unwatched" in done.stderr


def test_a_script_without_an_optimizer_runs_and_is_told_nothing_was_watched(socket_dir: Path, tmp_path: Path):
    script = tmp_path / "sgd_by_hand.py"  # word_language_model's default loop: p.data.add_(p.grad, alpha=-lr)
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "for _ in range(5):\n"
        "    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
        "    model.zero_grad()\n"
        "    loss.backward()\n"
        "    for p in model.parameters():\n"
        "        p.data.add_(p.grad, alpha=-0.1)\n"
        "print('trained')\n"
    )
    done = run([*TUIWATCH, "--run-dir", str(tmp_path / "runs"), str(script)], socket_dir)
    assert done.returncode == 0
    assert done.stdout == "trained\n"
    assert "no torch optimizer stepped in this script's process, so nothing was watched" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_fastai_learner_with_fastais_own_optimizer_is_told_how_to_give_it_a_torch_one(
    socket_dir: Path, tmp_path: Path
):
    # fastai's Learner (2.8, tried by hand) steps fastai.optimizer.Optimizer, its default Adam, which is no torch
    # optimizer: the line sent its user to the three lines, which cannot go inside Learner.fit. OptimWrapper over a
    # torch optimizer is fastai's own way to train with one, and tuiwatch run watches that (docs/integrations.md).
    # fastai is not a test dependency (it brings spaCy): its optimizer module stands in, as it steps by hand.
    package = tmp_path / "fastai"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "optimizer.py").write_text(
        "class Optimizer:\n"
        "    def __init__(self, params, lr):\n"
        "        self.params, self.lr = list(params), lr\n"
        "    def step(self):\n"
        "        for p in self.params:\n"
        "            p.data.add_(p.grad, alpha=-self.lr)\n"
    )
    script = tmp_path / "learner.py"
    script.write_text(
        "import torch\n"
        "from fastai.optimizer import Optimizer\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = Optimizer(model.parameters(), 0.1)\n"
        "for _ in range(3):\n"
        "    model.zero_grad()\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    opt.step()\n"
    )
    done = run([*TUIWATCH, "--run-dir", str(tmp_path / "runs"), str(script)], socket_dir)
    assert done.returncode == 0
    assert done.stderr.splitlines()[-1] == (
        "tuiwatch run: no torch optimizer stepped in this script's process, so nothing was watched; fastai's own "
        "optimizers are not torch's: a Learner given opt_func=partial(OptimWrapper, opt=torch.optim.AdamW) (from "
        "fastai.optimizer) steps a torch optimizer, which tuiwatch run watches"
    )
    assert not (tmp_path / "runs").exists()


def test_a_script_that_fails_before_training_keeps_its_error_and_exit_status_and_gets_no_advice(
    run_root: Path, socket_dir: Path
):
    # argparse's exit 2 was followed by "a loop that updates the weights itself ... needs the three lines".
    done = watched(run_root, socket_dir, "--no-such-flag")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[-2].endswith("error: unrecognized arguments: --no-such-flag")
    assert lines[-1] == (
        "tuiwatch run: the script ended (exit status 2) before any torch optimizer stepped, so nothing was watched"
    )
    assert not run_root.exists()


def test_an_lbfgs_closure_step_records_its_first_evaluation(run_root: Path, socket_dir: Path, tmp_path: Path):
    """time_sequence_prediction's loop: LBFGS calls the closure up to max_iter times inside step(). The step's loss
    and gradient norm are the first call's (at the weights the step starts from; what step() returns), not the sum
    of every evaluation's losses and not the gradients the previous step left."""
    truth_file = tmp_path / "truth.json"
    done = run(
        [*TUIWATCH, "--run-dir", str(run_root), str(SCRIPTS / "sine_lbfgs.py"), "--truth", str(truth_file)], socket_dir
    )
    assert done.returncode == 0, done.stderr
    truth = json.loads(truth_file.read_text())
    assert done.stdout.count("loss:") > 2 * len(truth)  # several evaluations a step, as LBFGS makes them
    steps = records(ledger_file(run_root), "step")
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert [s["loss"] for s in steps] == pytest.approx([loss for loss, _ in truth], rel=1e-9)
    assert [s["grad_norm"] for s in steps] == pytest.approx([norm for _, norm in truth], rel=1e-6)
    assert steps[0]["update_norm"] > 0  # the weights before the closure's calls, against those after the step


NANOGPT_SHAPED = """
import json, sys, time
import torch
from torch import nn

torch.manual_seed(0)
data = torch.randint(0, 16, (2000,))
model = nn.Sequential(nn.Embedding(16, 8), nn.Flatten(), nn.Linear(64, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

def get_batch():
    ix = torch.randint(len(data) - 9, (4,))
    return torch.stack([data[i : i + 8] for i in ix]), data[ix + 8]

@torch.no_grad()
def estimate_loss():
    model.eval()
    t0 = time.perf_counter()
    losses = [nn.functional.cross_entropy(model(x), y).item() for x, y in (get_batch() for _ in range(5))]
    time.sleep(0.2)  # a long evaluation (the script's own work, as nanoGPT's 200 eval batches are)
    model.train()
    return sum(losses) / len(losses), time.perf_counter() - t0

evals = {}
X, Y = get_batch()
for it in range(12):
    if it % 4 == 0:  # at the top of the loop, as nanoGPT evaluates (and saves) before the step's forward
        _, evals[it] = estimate_loss()
    loss = nn.functional.cross_entropy(model(X), Y)
    X, Y = get_batch()  # the next batch, fetched during this step
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
json.dump(evals, open(sys.argv[1], "w"))
"""


def test_a_loop_without_a_loader_opens_its_steps_at_the_training_forward(socket_dir: Path, tmp_path: Path):
    """nanoGPT's loop draws no DataLoader batch and evaluates at the top of its loop: that evaluation (0.2 s here)
    is no step's compute time. Before, each step began where the last ended and took the evaluation in."""
    truth = tmp_path / "evals.json"
    steps = records(run_source(NANOGPT_SHAPED, tmp_path, socket_dir, str(truth)), "step")
    evals = {int(k): v for k, v in json.loads(truth.read_text()).items()}
    assert [s["step"] for s in steps] == list(range(12))  # each iteration one step; the evaluations none
    # Step 0 is the Watch's first (made inside it); from step 1 on, a step is its forward, backward and update.
    for it in (4, 8):
        assert 0 < steps[it]["compute_s"] < evals[it], (it, steps[it]["compute_s"], evals[it])
        assert 0 < steps[it]["forward_s"] < evals[it]
    # Opened at the forward, the steps see it: its output is checked (before, no forward fell inside a step).
    assert [s["finite"]["forward"] for s in steps[2:]] == [True] * 10


DCGAN_SHAPED = """
import json, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
dataloader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8)
truth = []
for i, data in enumerate(dataloader, 0):
    netD.zero_grad()  # (1) Update D network, as pytorch/examples' dcgan does
    real_cpu = data[0]
    label = torch.full((real_cpu.size(0),), 1.0)
    errD_real = criterion(netD(real_cpu).view(-1), label)
    errD_real.backward()
    fake = netG(torch.randn(real_cpu.size(0), 4))
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    errD = errD_real + errD_fake
    optimizerD.step()
    netG.zero_grad()  # (2) Update G network
    label.fill_(1.0)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
    truth.append([errD.item(), errG.item()])
json.dump(truth, open(sys.argv[1], "w"))
"""


def test_a_gan_records_the_first_optimizers_loss_without_the_others(socket_dir: Path, tmp_path: Path):
    """dcgan's loop: the discriminator's optimizer steps first and is watched; the generator's loss, backpropagated
    after it and stepped on by the other optimizer, is not summed into the next discriminator step's."""
    truth_file = tmp_path / "truth.json"
    ledger = run_source(DCGAN_SHAPED, tmp_path, socket_dir, str(truth_file))
    truth = json.loads(truth_file.read_text())
    assert records(ledger, "run")[0]["model"] == "Sequential"
    steps = records(ledger, "step")
    assert len(steps) == len(truth) == 8
    assert [s["loss"] for s in steps] == pytest.approx([err_d for err_d, _ in truth], rel=1e-6)


ENCODER_DECODER = """
import json, sys
import torch
from torch import nn

torch.manual_seed(0)
encoder, decoder = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 3)  # two modules that no module holds
enc_opt, dec_opt = torch.optim.Adam(encoder.parameters()), torch.optim.Adam(decoder.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 5, 4), torch.randint(0, 3, (32,))),
                                     batch_size=8)
norms = []
for x, y in loader:
    enc_opt.zero_grad()
    dec_opt.zero_grad()
    out, _ = encoder(x)
    nn.functional.cross_entropy(decoder(out[:, -1]), y).backward()
    grads = [p.grad for p in [*encoder.parameters(), *decoder.parameters()]]
    norms.append(float(torch.sqrt(sum(g.pow(2).sum() for g in grads))))
    enc_opt.step()
    dec_opt.step()
json.dump(norms, open(sys.argv[1], "w"))
"""


def test_modules_that_one_backward_trains_each_with_its_optimizer_are_watched_as_one_model(
    socket_dir: Path, tmp_path: Path
):
    # PyTorch's seq2seq translation tutorial: an EncoderRNN and an AttnDecoderRNN, each with its own Adam, one loss.
    # The encoder was watched and the decoder, three quarters of the parameters, left out without a word; then
    # with a line that said so. Now both, as one model of two parts.
    truth = tmp_path / "norms.json"
    ledger = run_source(ENCODER_DECODER, tmp_path, socket_dir, str(truth))
    run_record = records(ledger, "run")[0]
    assert (run_record["model"], run_record["optimizer"]) == ("ModelOfParts", "Adam + Adam")
    assert run_record["integration"]["model"].startswith("ModelOfParts: GRU, Linear, the modules one backward trains")
    assert not any("not watched" in item for item in run_record["integration"]["not_seen"])
    steps = records(ledger, "step")
    assert len(steps) == 4
    assert [s["grad_norm"] for s in steps] == pytest.approx(json.loads(truth.read_text()), rel=1e-5)  # both parts'
    assert [s["lr"] for s in steps] == [[0.001, 0.01]] * 4  # both optimizers'
    # The model has no forward of its own: its parts' are watched (step 0's ran before the Watch existed).
    assert [s["finite"]["forward"] for s in steps] == [None, True, True, True]
    assert [s.get("classes") for s in steps] == [None, 3, None, None]  # the decoder's output: the last part's
    # A GAN's generator gets its gradients from a backward of its own, after the first step: not a part of it.
    gan = tmp_path / "gan.py"
    gan.write_text(DCGAN_SHAPED)
    done = run([*TUIWATCH, "--run-dir", str(tmp_path / "gan-runs"), str(gan), str(tmp_path / "t.json")], socket_dir)
    assert done.returncode == 0, done.stderr
    assert records(ledger_file(tmp_path / "gan-runs"), "run")[0]["model"] == "Sequential"


ONE_OPTIMIZER_OVER_MODULES_APART = """
import json, sys
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU())  # an autoencoder's two halves, no module holding both
decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
params = list(encoder.parameters()) + list(decoder.parameters())
scale = torch.zeros((), requires_grad=True)  # a learnable scalar beside them, in no module (CLIP's logit scale)
if sys.argv[2] == "temperature":
    params.append(scale)
opt = torch.optim.Adam(params, lr=1e-3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(128, 16)), batch_size=32)
norms = []
for (xb,) in loader:
    loss = nn.functional.mse_loss(decoder(encoder(xb)), xb) * scale.exp()
    opt.zero_grad()
    loss.backward()
    norms.append(float(torch.sqrt(sum(p.grad.pow(2).sum() for p in params if p.grad is not None))))
    opt.step()
json.dump(norms, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("beside", ["nothing", "temperature"])
def test_one_optimizer_over_modules_no_module_holds_is_watched_over_them_all(
    socket_dir: Path, tmp_path: Path, beside: str
):
    # The decoder, the module holding the most of the optimizer's parameters, was the model: the encoder's were left
    # out of the norms and of a checkpoint, without a word.
    truth = tmp_path / "norms.json"
    ledger = run_source(ONE_OPTIMIZER_OVER_MODULES_APART, tmp_path, socket_dir, str(truth), beside)
    run_record = records(ledger, "run")[0]
    assert run_record["model"] == "ModelOfParts"
    scale = beside == "temperature"
    assert run_record["params"] == 136 + 816 + scale
    assert run_record["integration"]["model"] == (
        f"ModelOfParts: Sequential, Sequential{', BareTensors' if scale else ''}, the modules that hold the "
        "optimizer's parameters, which no module holds all of"
    )
    steps = records(ledger, "step")
    assert [s["grad_norm"] for s in steps] == pytest.approx(json.loads(truth.read_text()), rel=1e-5)
    assert [s["finite"]["forward"] for s in steps] == [None, True, True, True]  # (step 0 ran before the Watch)


ONE_MODEL_AFTER_ANOTHER = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(256, 6), torch.randint(0, 3, (256,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
first, second = nn.Linear(6, 3), nn.Linear(6, 3)
kept = []

def train(model, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if sys.argv[1] == "teacher kept":
        kept.append(opt)  # the script holds on to the teacher's optimizer
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()

if sys.argv[1] != "taking turns":  # the knowledge distillation tutorial's order (and an Optuna sweep's trials)
    train(first, 1)
    train(second, 3)
else:  # Spinning Up's VPG: one policy step, then 80 value-function steps, every epoch
    pi_opt, v_opt = torch.optim.Adam(first.parameters()), torch.optim.Adam(second.parameters())
    for epoch in range(4):
        pi_opt.zero_grad()
        nn.functional.cross_entropy(first(x), y).backward()
        pi_opt.step()
        for _ in range(80):
            v_opt.zero_grad()
            nn.functional.cross_entropy(second(x), y).backward()
            v_opt.step()
"""


def test_a_model_trained_after_the_watched_one_is_a_run_of_its_own_once_the_first_optimizer_is_gone(
    socket_dir: Path, tmp_path: Path
):
    # The knowledge distillation tutorial trains its teacher, then its student with another optimizer, each made in
    # its train(): the teacher was watched (32 steps), and the student's 96 were named in one line as not watched.
    script = tmp_path / "script.py"
    script.write_text(ONE_MODEL_AFTER_ANOTHER)
    done = run([*TUIWATCH, "--run-dir", str(tmp_path / "runs"), str(script), "teacher then student"], socket_dir)
    assert done.returncode == 0, done.stderr
    assert "since the watched one" not in done.stderr
    ledgers = sorted((tmp_path / "runs").glob("*/ledger.jsonl"), key=lambda p: records(p, "run")[0]["t"])
    assert len(ledgers) == 2
    for ledger, steps, epochs in zip(ledgers, (32, 96), (1, 3), strict=True):
        taken = records(ledger, "step")
        assert len(taken) == steps
        assert all(r["loss"] is not None and r["opt_step"] == r["step"] + 1 for r in taken)
        assert [r["epoch"] for r in taken] == [e for e in range(epochs) for _ in range(32)]
        assert all(r.get("batch_ids") is not None for r in taken[1:])  # (the first step's batch came before its Watch)
        end = records(ledger, "end")
        assert [(e["reason"], e["steps"], e["opt_steps"]) for e in end] == [("finished", steps, steps)]


@pytest.mark.parametrize("order", ["teacher kept", "taking turns"])
def test_another_model_trained_after_the_watched_one_is_named_as_not_watched(
    socket_dir: Path, tmp_path: Path, order: str
):
    # While the script holds the watched optimizer, it may step again: a second model trained meanwhile is named in one
    # line, once it has stepped many times alone, and optimizers that take turns are not.
    script = tmp_path / "script.py"
    script.write_text(ONE_MODEL_AFTER_ANOTHER)
    done = run([*TUIWATCH, "--run-dir", str(tmp_path / "runs"), str(script), order], socket_dir)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "since the watched one" in line]
    if order == "teacher kept":
        assert said == [
            "tuiwatch run: another optimizer (SGD) has stepped 50 times since the watched one (SGD over Linear) last "
            "did, at step 31: its model is not watched. A script that trains one model after another (a teacher, "
            "then its student) is watched for the next once it lets go of the first one's optimizer; while it keeps "
            "it, the three lines in the second's loop watch that one"
        ]
    else:
        assert said == []  # 80 steps of the other between two of the watched one's, from the start: taking turns
    steps = records(ledger_file(tmp_path / "runs"), "step")
    assert len(steps) == (32 if order == "teacher kept" else 4)
    # The student's batches open no step of the teacher's: each is undone when the student's optimizer steps on it,
    # so the last step opened is the teacher's 31, as the line says (before, they all folded into one open step 32,
    # its ids one batch longer at every student step, left out of the ledger at the end).
    assert all(s.get("micro_batches") is None for s in steps)


A_NEW_OPTIMIZER_EACH_STAGE = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(256, 6)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :3].argmax(1)), batch_size=32)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
for stage in range(3):
    if sys.argv[1] == "decay":  # an old script's schedule: a new optimizer at a lower lr each epoch
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * 0.5**stage, momentum=0.9)
    else:  # gradual unfreezing: the head first, then one more layer with each new optimizer
        model[0].requires_grad_(stage > 0)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
"""


@pytest.mark.parametrize("stages", ["decay", "unfreeze"])
def test_a_new_optimizer_over_the_same_model_goes_on_the_same_run(socket_dir: Path, tmp_path: Path, stages: str):
    # Each stage's optimizer made its own run (three runs of 8 steps, each starting at step 0).
    done = run_written(A_NEW_OPTIMIZER_EACH_STAGE, tmp_path, socket_dir, stages)
    assert done.returncode == 0, done.stderr
    steps = records(ledger_file(tmp_path / "runs"), "step")
    assert [s["opt_step"] for s in steps] == list(range(1, 25))
    assert [s["epoch"] for s in steps] == [e for e in range(3) for _ in range(8)]
    lrs = [[0.1], [0.05], [0.025]] if stages == "decay" else [[1e-3]] * 3
    assert [s["lr"] for s in steps] == [lr for lr in lrs for _ in range(8)]
    assert [line for line in done.stderr.splitlines() if "replaced its optimizer" in line] == [
        f"tuiwatch: script: the loop replaced its optimizer at step 8: a new {'SGD' if stages == 'decay' else 'Adam'} "
        "over the model's parameters, whose lr, norms and updates are read from there on (and those of any later one "
        "that replaces it)"
    ]


LOSS_WITHOUT_AN_UPDATE = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(80, 4)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, 0].gt(0).long()), batch_size=8)
for i, (xb, yb) in enumerate(loader):
    if sys.argv[1] == "inf" and i == 5:
        xb = xb.clone()
        xb[0, 0] = float("inf")  # the loop's own bug, after the loader
    loss = nn.functional.cross_entropy(model(xb), yb) / 4
    loss.backward()
    print(loss.item())
    if i % 4 == 3:  # 4 micro-batches an update: the last 2 batches (8 and 9) never stepped
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("case", ["inf", "tail"])
def test_a_step_without_its_update_records_the_loss_it_backpropagated(socket_dir: Path, tmp_path: Path, case: str):
    # The step a non-finite gradient stopped before its update had no loss ("loss -" in the alert), and the script's
    # last micro-batches, backpropagated with no update after them, made a last step without one.
    done = run_written(LOSS_WITHOUT_AN_UPDATE, tmp_path, socket_dir, case)
    printed = [float(v) for v in done.stdout.split()]
    ledger = ledger_file(tmp_path / "runs")
    steps = records(ledger, "step")
    if case == "inf":
        assert done.returncode == 1
        assert [s["opt_step"] for s in steps] == [1, None]
        assert math.isnan(steps[1]["loss"])
        assert steps[1]["finite"] == {"batch": True, "forward": False, "loss": False, "grad": False, "param": None}
        (alert,) = records(ledger, "alert")
        assert alert["message"] == "first at step 1, boundary=forward (loss nan, grad norm nan)"
    else:
        assert done.returncode == 0, done.stderr
        assert [s["opt_step"] for s in steps] == [1, 2, None]
        assert [s["micro_batches"] for s in steps[1:]] == [4, 2]
        assert steps[2]["loss"] == pytest.approx(sum(printed[8:]), rel=1e-6)
    assert steps[1]["loss"] == pytest.approx(sum(printed[4:8]), rel=1e-6, nan_ok=True)


MUON_SHAPED = """
import json, math, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
muon = torch.optim.Muon([p for p in model.parameters() if p.ndim == 2], lr=0.02)  # torch's pairing: the matrices
adamw = torch.optim.AdamW([p for p in model.parameters() if p.ndim != 2], lr=1e-3)  # ... and AdamW for the rest
x = torch.randn(640, 8)
loader = DataLoader(TensorDataset(x, x[:, :4].argmax(1)), batch_size=32)
truth = []
for i, (xb, yb) in enumerate(loader):
    before = [p.detach().clone() for p in model.parameters()]
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    muon.step()
    if sys.argv[2] == "every" or i % 2:  # "alternate": AdamW steps every other step
        adamw.step()
    muon.zero_grad()
    adamw.zero_grad()
    moved = sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(model.parameters(), before))
    truth.append([loss.item(), math.sqrt(moved)])
json.dump(truth, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("adamw", ["every", "alternate"])
def test_an_optimizer_beside_the_first_over_the_same_model_is_watched_with_it(
    socket_dir: Path, tmp_path: Path, adamw: str
):
    """Muon for the matrices beside AdamW for the rest: the first to step was watched alone, its lr the only one
    and its update norm without AdamW's. Both are watched now, and the step ends after the last of them (or, when
    AdamW does not step, at the next batch)."""
    truth_file = tmp_path / "truth.json"
    ledger = run_source(MUON_SHAPED, tmp_path, socket_dir, str(truth_file), adamw)
    truth = json.loads(truth_file.read_text())
    assert records(ledger, "run")[0]["optimizer"] == "Muon + AdamW"
    steps = records(ledger, "step")
    assert [s["step"] for s in steps] == list(range(BATCHES))
    assert [s["opt_step"] for s in steps] == list(range(1, BATCHES + 1))
    assert all(s["lr"] == [0.02, 1e-3] for s in steps)
    assert [s["loss"] for s in steps] == pytest.approx([loss for loss, _ in truth], rel=1e-6)
    sampled = [(s["step"], s["update_norm"]) for s in steps if s["update_norm"] is not None]
    assert sampled == [(0, pytest.approx(truth[0][1], rel=1e-5)), (10, pytest.approx(truth[10][1], rel=1e-5))]
    assert all(s["batch_shape"] == [[32, 8], [32]] for s in steps[1:])  # each step the batch it trained on


GPT_MUON_SHAPED = """
import torch
from torch import nn
from torch.nn import functional as F

class Block(nn.Module):  # modded-nanogpt's shape: bias-free matrices, a norm without weights
    def __init__(self, d):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return x + self.proj(F.relu(self.fc(F.rms_norm(x, (x.size(-1),)))).square())

class GPT(nn.Module):
    def __init__(self, vocab=32, d=32):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab, bias=False)
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(F.rms_norm(x, (x.size(-1),)))

torch.manual_seed(0)
model = GPT()
hidden = [p for name, p in model.named_parameters() if name.startswith("blocks.")]
rest = [p for name, p in model.named_parameters() if not name.startswith("blocks.")]
optimizers = [torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=3e-3)]
data = torch.arange(4096) % 32
for _ in range(12):
    starts = torch.randint(0, 4000, (16,))
    x = torch.stack([data[i : i + 16] for i in starts])
    y = torch.stack([data[i + 1 : i + 17] for i in starts])
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    for optimizer in optimizers:
        optimizer.step()
    for optimizer in optimizers:
        optimizer.zero_grad()
"""


def test_muon_over_blocks_that_hold_nothing_else_is_watched_on_the_whole_model_with_adamw(
    socket_dir: Path, tmp_path: Path
):
    """Muon steps a GPT's blocks, which hold its matrices and nothing AdamW steps: the model found was the blocks'
    ModuleList (no forward runs through it: no output check, no phases), its lr Muon's alone. One backward filled
    both optimizers' gradients before the first step: the model is the GPT, both optimizers watched."""
    ledger = run_source(GPT_MUON_SHAPED, tmp_path, socket_dir)
    run_record = records(ledger, "run")[0]
    assert (run_record["model"], run_record["optimizer"], run_record["params"]) == ("GPT", "Muon + AdamW", 18_432)
    steps = records(ledger, "step")
    assert len(steps) == 12
    assert all(s["lr"] == [0.02, 3e-3] for s in steps)
    assert [s["finite"]["forward"] for s in steps[2:]] == [True] * 10  # the GPT's forward, checked
    assert records(ledger, "alert") == []


SAC_SHAPED = """
import json, sys
import torch
from torch import nn

class Policy(nn.Module):  # stable-baselines3's SACPolicy: an actor and a critic, each with its own optimizer
    def __init__(self):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh())
        self.critic = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

torch.manual_seed(0)
policy = Policy()
log_alpha = torch.zeros(1, requires_grad=True)  # the entropy coefficient: a plain tensor no module holds
alpha_optimizer = torch.optim.Adam([log_alpha], lr=3e-4)
critic_optimizer = torch.optim.Adam(policy.critic.parameters(), lr=3e-4)
actor_optimizer = torch.optim.Adam(policy.actor.parameters(), lr=3e-4)
truth = []
for _ in range(12):
    obs, reward = torch.randn(32, 3), torch.randn(32, 1)
    action = policy.actor(obs)
    alpha_loss = -(log_alpha * (action.detach().abs() - 1.0)).mean()  # SAC steps this one first
    alpha_optimizer.zero_grad()
    alpha_loss.backward()
    alpha_optimizer.step()
    critic_loss = (policy.critic(torch.cat([obs, action.detach()], 1)) - reward).pow(2).mean()
    critic_optimizer.zero_grad()
    critic_loss.backward()
    norm = torch.cat([p.grad.flatten() for p in policy.critic.parameters()]).norm().item()
    critic_optimizer.step()
    actor_loss = -policy.critic(torch.cat([obs, policy.actor(obs)], 1)).mean()
    actor_optimizer.zero_grad()
    actor_loss.backward()  # its gradients stay on the actor until its next zero_grad
    actor_optimizer.step()
    truth.append([critic_loss.item(), norm])
json.dump(truth, open(sys.argv[1], "w"))
"""


def test_sac_is_watched_by_its_critics_optimizer_over_the_critic_alone(socket_dir: Path, tmp_path: Path):
    """The entropy coefficient's optimizer steps first but holds one plain tensor: the next optimizer is watched.
    Its parameters are the critic's, inside a policy that holds the actor too: the norms are the critic's, not the
    policy's with the actor's gradients left from its last step in them."""
    truth_file = tmp_path / "truth.json"
    ledger = run_source(SAC_SHAPED, tmp_path, socket_dir, str(truth_file))
    truth = json.loads(truth_file.read_text())
    assert (records(ledger, "run")[0]["model"], records(ledger, "run")[0]["params"]) == ("Sequential", 97)
    steps = records(ledger, "step")
    assert len(steps) == len(truth) == 12
    assert [s["loss"] for s in steps] == pytest.approx([loss for loss, _ in truth], rel=1e-6)
    assert [s["grad_norm"] for s in steps] == pytest.approx([norm for _, norm in truth], rel=1e-5)
    assert records(ledger, "alert") == []


BARE_FIRST_MODULE_LATER = """
import torch
scale = torch.ones(1, requires_grad=True)
model = torch.nn.Linear(4, 1)
scale_optimizer = torch.optim.SGD([scale], lr=0.01)
model_optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # made for later, never stepped here
for _ in range(6):
    loss = (scale * torch.randn(8)).pow(2).mean()
    scale_optimizer.zero_grad()
    loss.backward()
    scale_optimizer.step()
"""


def test_a_bare_tensors_optimizer_passed_over_is_watched_when_it_steps_again_first(socket_dir: Path, tmp_path: Path):
    ledger = run_source(BARE_FIRST_MODULE_LATER, tmp_path, socket_dir)
    assert records(ledger, "run")[0]["model"] == "BareTensors"
    assert len(records(ledger, "step")) == 5  # from its second step: the first was passed over
    assert all(s["grad_norm"] > 0 for s in records(ledger, "step"))


HOGWILD_SHAPED = """
import torch
import torch.multiprocessing as mp

def train(rank, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()

if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    model.share_memory()
    processes = [mp.get_context("fork").Process(target=train, args=(rank, model)) for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print("exit codes", [p.exitcode for p in processes])
"""


def test_training_in_forked_children_is_not_watched_and_says_so(socket_dir: Path, tmp_path: Path):
    """mnist_hogwild's shape: the workers inherit tuiwatch run's hooks through fork but exit with os._exit (no Watch
    could end its ledger) and would be N runs of one name, so they are left unwatched, each saying so once."""
    script = tmp_path / "hogwild_shaped.py"
    script.write_text(HOGWILD_SHAPED)
    done = run([*TUIWATCH, "--run-dir", str(tmp_path / "runs"), str(script)], socket_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exit codes [0, 0]\n"
    assert done.stderr.count("an optimizer stepped in a child process") == 2
    assert "no torch optimizer stepped in this script's process, so nothing was watched" in done.stderr
    assert not (tmp_path / "runs").exists()


RAW_TENSORS = """
import json, sys
import torch
torch.manual_seed(0)
x = torch.randn(256, 3)
y = x @ torch.tensor([2.0, -1.0, 0.5]) + 0.3
w = torch.zeros(3, requires_grad=True)  # no nn.Module at all, as tutorials write a regression
b = torch.zeros(1, requires_grad=True)
optimizer = torch.optim.SGD([w, b], lr=0.1)
norms = []
for _ in range(30):
    loss = ((x @ w + b - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    norms.append(torch.cat([w.grad, b.grad]).norm().item())
    optimizer.step()
json.dump(norms, open(sys.argv[1], "w"))
"""


def test_an_optimizer_over_tensors_no_module_holds_has_their_gradient_norms_and_no_alert(
    socket_dir: Path, tmp_path: Path
):
    truth = tmp_path / "norms.json"
    ledger = run_source(RAW_TENSORS, tmp_path, socket_dir, str(truth))
    assert (records(ledger, "run")[0]["model"], records(ledger, "run")[0]["params"]) == ("BareTensors", 4)
    steps = records(ledger, "step")
    # Each a new Parameter over the tensor's storage (nn.ParameterList), they had no .grad: every norm was
    # missing and grad-zero said "gradients are missing for 5 optimizer steps" (critical) on a healthy run.
    assert [s["grad_norm"] for s in steps] == pytest.approx(json.loads(truth.read_text()), rel=1e-5)
    assert steps[-1]["loss"] < 1e-3
    assert records(ledger, "alert") == []


ROLLOUTS = """import gymnasium as gym
import torch

torch.manual_seed(0)
env = gym.make("CartPole-v1")
env.action_space.seed(0)
value = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(value.parameters(), lr=1e-2)
obs, _ = env.reset(seed=0)
for rollout in range(6):
    # The policy changes between rollouts (a balancing one, then a random one), so the returns the value head
    # is fitted to change too, as they do between a policy-gradient method's rollouts.
    balancing = rollout % 2 == 0
    states, rewards, dones = [], [], []
    for _ in range(256):
        states.append(obs)
        action = int(obs[2] + obs[3] > 0) if balancing else env.action_space.sample()
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        dones.append(terminated or truncated)
        if terminated or truncated:
            obs, _ = env.reset()
    returns, running = [], 0.0
    for reward, done in zip(reversed(rewards), reversed(dones)):
        running = reward + 0.95 * running * (not done)
        returns.append(running)
    x = torch.tensor(states, dtype=torch.float32)
    y = torch.tensor(returns[::-1], dtype=torch.float32).unsqueeze(1)
    for _ in range(100):
        loss = torch.nn.functional.mse_loss(value(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_reinforcement_learning_loop_runs_without_the_rules_its_rollouts_set_off_unless_asked(
    socket_dir: Path, tmp_path: Path
):
    # Not importorskip: imported into this test process, it would make every later Watch here a reinforcement-
    # learning one (loss-spike off: a test of its dumps failed so).
    if importlib.util.find_spec("gymnasium") is None:
        pytest.skip("needs gymnasium")

    def ran(*options: str) -> list[Record]:
        return records(run_source(ROLLOUTS, tmp_path, socket_dir, options=options, runs=f"runs{len(options)}"))

    default = ran()
    run_record = default[0]
    assert run_record["rules"] == {"loss-spike": False, "grad-explosion": False, "loss-chance": False}
    assert run_record["rules_note"].startswith("reinforcement learning (gymnasium is imported): a policy's loss")
    assert len([r for r in default if r["kind"] == "step"]) == 600
    assert [r for r in default if r["kind"] == "alert"] == []
    # The same run with the two rules named: each new rollout's returns (another policy's) are a "spike".
    named = ran("--rules", '{"loss-spike": true, "grad-explosion": true, "loss-chance": true}')
    assert named[0]["rules"] == {"loss-spike": True, "grad-explosion": True, "loss-chance": True}
    assert named[0]["rules_note"] is None
    losses = [r["loss"] for r in named if r["kind"] == "step"]
    assert losses == [r["loss"] for r in default if r["kind"] == "step"]
    assert losses[400] > 3 * losses[399]
    fired = {(a["rule"], a["step"]) for a in named if a["kind"] == "alert" and a["severity"] == "warning"}
    assert fired == {("loss-spike", 400), ("grad-explosion", 400)}


REGRESSION_IN_A_CLOSURE = """import torch
from torch.utils.data import DataLoader, TensorDataset

g = torch.Generator().manual_seed(0)
torch.manual_seed(0)
x = torch.randn(20000, 8, generator=g)
y = x @ (0.3 * torch.randn(8, 2, generator=g)) + 0.7**0.5 * torch.randn(20000, 2, generator=g)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True, generator=g)
for epoch in range(4):
    for xb, yb in loader:
        def closure():  # as skorch trains: the forward inside optimizer.step
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            return loss
        optimizer.step(closure)
"""


def test_a_regression_whose_forward_runs_in_the_first_steps_closure_gets_no_class_count(
    socket_dir: Path, tmp_path: Path
):
    # A healthy two-output regression (its MSE settles near ln 2), trained as skorch trains: the forward inside
    # optimizer.step(closure). The Watch is made in that first step, after its batch was drawn, and its forward
    # came with no batch to tell a regression by: the width made it 2 classes, and loss-chance fired at step 211.
    ledger = run_source(REGRESSION_IN_A_CLOSURE, tmp_path, socket_dir, options=("--rules", '{"data-bound": false}'))
    steps = records(ledger, "step")
    assert len(steps) == 316
    assert steps[0]["batch_shape"] is None
    assert steps[1]["batch_shape"] == [[256, 8], [256, 2]]
    assert [s["step"] for s in steps if "classes" in s] == []
    assert records(ledger, "alert") == []


AT_CHANCE = """
import torch
model = torch.nn.Linear(4, 2)
torch.nn.init.zeros_(model.weight)
torch.nn.init.zeros_(model.bias)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # never learns: the loss is ln 2 at every step
for _ in range(210):
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
"""


def test_the_rules_option_sets_the_watchs_rules_and_a_bad_one_stops_before_the_script(socket_dir: Path, tmp_path: Path):
    script = tmp_path / "at_chance.py"
    script.write_text(AT_CHANCE)

    def alerts(*options: str) -> list[str]:
        runs = tmp_path / f"runs{len(options)}"
        done = run([*TUIWATCH, "--run-dir", str(runs), *options, str(script)], socket_dir)
        assert done.returncode == 0, done.stderr
        return sorted({a["rule"] for a in records(ledger_file(runs), "alert") if a["severity"] != "info"})

    assert alerts() == ["loss-chance", "loss-frozen", "lr-zero"]
    assert alerts("--rules", '{"lr-zero": false}') == ["loss-chance", "loss-frozen"]
    bad = run([*TUIWATCH, "--rules", '{"lr-zero": {"steps": "ten"}}', str(script)], socket_dir, cwd=tmp_path)
    assert (bad.returncode, bad.stdout) == (1, "")  # the script never ran
    assert bad.stderr == "tuiwatch: error: run --rules: rule 'lr-zero': threshold steps takes a number, got 'ten'\n"
    assert not (tmp_path / "runs").exists()


# Forty samples, each input's first value its index: the ids a step records can be checked against it.
INDEXED = """
import json, sys
import torch
from torch.utils.data import DataLoader, Dataset

class Indexed(Dataset):
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return torch.full((3,), float(i)), torch.tensor(i % 2)
"""

ONE_AHEAD = (
    INDEXED
    + """
class OneAhead:  # Accelerate's DataLoaderShard, as it iterates: one batch ahead, skip_batches when resuming
    def __init__(self, loader, skip_batches=0):
        self.base_dataloader, self.skip_batches = loader, skip_batches
    def __iter__(self):
        dataloader_iter = self.base_dataloader.__iter__()
        try:
            current_batch = next(dataloader_iter)
        except StopIteration:
            return
        batch_index = 0
        while True:
            try:
                next_batch = next(dataloader_iter)
                if batch_index >= self.skip_batches:
                    yield current_batch
                batch_index += 1
                current_batch = next_batch
            except StopIteration:
                if batch_index >= self.skip_batches:
                    yield current_batch
                break

class PrefetchLoader:  # timm's (timm/data/loader.py), as it iterates on the CPU: the next batch normalised first
    def __init__(self, loader, skip_batches=0):
        self.loader = loader
    def __iter__(self):
        first = True
        for next_input, next_target in self.loader:
            next_input = next_input.to(torch.float32).sub_(1.0).div_(1.0)
            if not first:
                yield input, target
            else:
                first = False
            input = next_input
            target = next_target
        yield input, target

class data_prefetcher:  # NVIDIA apex's ImageNet example's, as copied into many repositories, less its CUDA stream
    def __init__(self, loader):
        self.loader = iter(loader)
        self.preload()
    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = None
            self.next_target = None
            return
        self.next_input = self.next_input.float().sub_(1.0).div_(1.0)
    def next(self):
        input = self.next_input
        target = self.next_target
        self.preload()
        return input, target

def apex(loader, skip_batches=0):  # its loop: x, y = prefetcher.next(); while x is not None: ...
    prefetcher = data_prefetcher(loader)
    x, y = prefetcher.next()
    while x is not None:
        yield x, y
        x, y = prefetcher.next()

adapter = {"accelerate": OneAhead, "timm": PrefetchLoader, "apex": apex}[sys.argv[2]]
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
seen = []
for epoch, skip in enumerate((0, 2) if adapter is OneAhead else (0, 0)):  # resuming mid-epoch skips two batches
    for x, y in adapter(DataLoader(Indexed(), batch_size=4, shuffle=True), skip_batches=skip):
        seen.append((x[:, 0] + (adapter is not OneAhead)).long().tolist())
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
json.dump(seen, open(sys.argv[1], "w"))
"""
)


@pytest.mark.parametrize("adapter", ["accelerate", "timm", "apex"])
def test_an_adapter_that_draws_one_batch_ahead_gives_each_step_the_batch_it_trained_on(
    socket_dir: Path, tmp_path: Path, adapter: str
):
    # timm's train.py iterates a PrefetchLoader by default: each step had the ids of the batch after its own, an
    # epoch's last step no batch but the iteration's end, and the next epoch's first step three batches.
    truth = tmp_path / "seen.json"
    steps = records(run_source(ONE_AHEAD, tmp_path, socket_dir, str(truth), adapter), "step")
    seen = json.loads(truth.read_text())
    resumed = 8 if adapter == "accelerate" else 10  # Accelerate's second pass resumes mid-epoch: two batches skipped
    assert len(seen) == 10 + resumed  # 40 samples in 4s
    assert [s["batch_ids"] for s in steps[1:]] == seen[1:]  # (step 0's batch came before the Watch)
    assert [s["epoch"] for s in steps[1:]] == [0] * 9 + [1] * resumed
    assert all("micro_batches" not in s for s in steps)


DRAWN_IN_A_THREAD = (
    INDEXED
    + """
import queue, threading

class BackgroundGenerator(threading.Thread):  # prefetch_generator's, as `DataLoaderX` scripts use it
    def __init__(self, generator, max_prefetch=1):
        threading.Thread.__init__(self)
        self.queue = queue.Queue(max_prefetch)
        self.generator = generator
        self.daemon = True
        self.start()
    def run(self):
        for item in self.generator:
            self.queue.put(item)
        self.queue.put(None)
    def __next__(self):
        item = self.queue.get()
        if item is None:
            raise StopIteration
        return item
    def __iter__(self):
        return self

class DataLoaderX(DataLoader):
    def __iter__(self):
        return BackgroundGenerator(super().__iter__())

torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
for epoch in range(3):
    for x, y in DataLoaderX(Indexed(), batch_size=4, shuffle=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
json.dump(losses, open(sys.argv[1], "w"))
"""
)


def test_batches_a_background_thread_draws_ahead_are_no_steps_batches(socket_dir: Path, tmp_path: Path):
    # A thread fills a queue ahead of the loop: its draws, taken as the loop's, made steps of three micro-batches
    # and steps of none, their ids another step's. Which step trains on a batch drawn there is not known: the steps
    # open at the model's training forwards, without batch facts, and the epochs still begin where they do.
    truth = tmp_path / "seen.json"
    steps = records(run_source(DRAWN_IN_A_THREAD, tmp_path, socket_dir, str(truth)), "step")
    losses = json.loads(truth.read_text())
    assert len(steps) == len(losses) == 30
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-6)
    assert all(s["batch_ids"] is None and s["batch_shape"] is None and "micro_batches" not in s for s in steps)
    assert [s["epoch"] for s in steps] == [0] * 10 + [1] * 10 + [2] * 10
    assert all(s["finite"]["forward"] is True for s in steps[2:])  # (steps open at forwards from the third)


MULTI_EPOCHS = (
    INDEXED
    + """
class MultiEpochsDataLoader(DataLoader):  # timm's (--use-multi-epochs-loader): one iterator for every epoch
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._DataLoader__initialized = False
        self.batch_sampler = _RepeatSampler(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = super().__iter__()
    def __len__(self):
        return len(self.batch_sampler.sampler)
    def __iter__(self):
        for i in range(len(self)):
            yield next(self.iterator)
    def reset(self):  # Ultralytics' InfiniteDataLoader.reset(), at close_mosaic: a new iterator, not by iter()
        self.iterator = self._get_iterator()

class _RepeatSampler:
    def __init__(self, sampler):
        self.sampler = sampler
    def __iter__(self):
        while True:
            yield from iter(self.sampler)

class PrefetchLoader:  # timm's, as it iterates on the CPU: the next batch drawn before this one is handed over
    def __init__(self, loader):
        self.loader = loader
    def __iter__(self):
        held = None
        for batch in self.loader:
            if held is not None:
                yield held
            held = batch
        if held is not None:
            yield held

torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = MultiEpochsDataLoader(Indexed(), batch_size=4, shuffle=True, num_workers=int(sys.argv[2]))
seen = []
for epoch in range(2):
    if epoch == 1 and sys.argv[3:] == ["reset"]:
        loader.reset()
    for x, y in PrefetchLoader(loader) if sys.argv[3:] == ["prefetch"] else loader:
        seen.append(x[:, 0].long().tolist())
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
json.dump(seen, open(sys.argv[1], "w"))
"""
)


@pytest.mark.parametrize(("workers", "how"), [(0, ""), (2, ""), (2, "reset"), (2, "prefetch")])
def test_a_loader_subclass_whose_init_calls_torchs_iter_runs_and_records_its_ids_and_epochs(
    socket_dir: Path, tmp_path: Path, workers: int, how: str
):
    # timm's MultiEpochsDataLoader keeps super().__iter__() from its __init__; tuiwatch run's wrapper of torch's
    # __iter__ called iter(loader), which is the subclass's own generator: the script failed at its first batch
    # with "ValueError: generator already executing". Its one iterator serves every epoch: each step was epoch 0.
    truth = tmp_path / "seen.json"
    steps = records(run_source(MULTI_EPOCHS, tmp_path, socket_dir, str(truth), str(workers), how), "step")
    seen = json.loads(truth.read_text())
    assert len(seen) == len(steps) == 20
    assert [s["epoch"] for s in steps] == [0] * 10 + [1] * 10
    assert all("micro_batches" not in s for s in steps)
    # Step 0's batch came before the Watch. An iterator made by reset() has no recorder from iter(): its draws are
    # recorded once it has handed out its first batch, by when its workers had been sent 2 × 2 + 1: ids not known.
    # Under timm's PrefetchLoader (its default) an epoch's last batch is handed over with no draw to tell: its step
    # opens at its forward, without batch facts; each other step had the next one's ids.
    unknown = {"reset": set(range(10, 15)), "prefetch": {9, 19}}.get(how, set())
    assert [s["batch_ids"] for s in steps[1:]] == [None if i in unknown else ids for i, ids in enumerate(seen)][1:]


EVALUATES_ON_ITS_TRAINING_SET = """
import json, pickle, sys
import torch
from torch import nn

torch.manual_seed(0)
x = torch.cat([torch.arange(96.0)[:, None], torch.randn(96, 4)], 1)  # each row starts with its index
data = torch.utils.data.TensorDataset(x, torch.randint(0, 2, (96,)))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
wrapped = sys.argv[2] == "wrapped"
model = nn.DataParallel(nn.Linear(5, 2)) if wrapped else nn.Linear(5, 2)  # (on the CPU it calls its module)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def evaluate(batches):
    model.eval()
    with torch.no_grad():
        for inputs, _ in batches:
            # A save or an EMA copy while a batch is held: nothing of tuiwatch in it.
            assert b"tuiwatch" not in pickle.dumps(model) + pickle.dumps(getattr(model, "module", model))
            (model.module if wrapped else model)(inputs)  # a wrapped model evaluated through what it wraps
    model.train()

seen = []
batches = iter(loader)
for i in range(12):
    if i == 6:
        evaluate(torch.utils.data.DataLoader(data, batch_size=32))  # minGPT's adder: a new loader on its training set
        evaluate(loader)  # the training loader itself
        model.eval()  # the Trainer: a step's batch drawn after an evaluation, before model.train()
        inputs, labels = next(batches)
        model.train()
    else:
        inputs, labels = next(batches)
    seen.append(inputs[:, 0].long().tolist())
    loss = nn.functional.cross_entropy(model(inputs), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
json.dump(seen, open(sys.argv[1], "w"))
"""


def steps_and_seen(
    script_text: str, run_root: Path, socket_dir: Path, tmp_path: Path, *args: str
) -> tuple[list[Record], Any]:
    """The step records of ``script_text`` run under tuiwatch run, and what the script saw itself (the ids of the
    batches it trained on, say), which it writes as JSON to its first argument."""
    script, truth = tmp_path / "script.py", tmp_path / "seen.json"
    script.write_text(script_text)
    done = run([*TUIWATCH, "--run-dir", str(run_root), str(script), str(truth), *args], socket_dir)
    assert done.returncode == 0, done.stderr
    return records(ledger_file(run_root), "step"), json.loads(truth.read_text())


@pytest.mark.parametrize("model", ["plain", "wrapped"])
def test_an_evaluation_on_the_training_set_is_no_step_and_a_batch_drawn_before_model_train_is_one(
    run_root: Path, socket_dir: Path, tmp_path: Path, model: str
):
    # minGPT's adder scores its model on its training set (a new DataLoader, eval mode, no_grad) every 500 steps:
    # those 95 batches were taken for the next step's (4,096 ids, the evaluation in its compute time), because a
    # batch drawn in eval mode from a dataset steps trained on counts as training's (the Trainer draws the next
    # step's batches before model.train()). The model's next forward now tells the two apart.
    steps, seen = steps_and_seen(EVALUATES_ON_ITS_TRAINING_SET, run_root, socket_dir, tmp_path, model)
    assert [s["step"] for s in steps] == list(range(12))
    # Step 0's batch was drawn before the first optimizer step made the Watch; every other step has its own.
    assert [s["batch_ids"] for s in steps[1:]] == seen[1:]
    assert all(s["batch_shape"] == [[8, 5], [8]] and s.get("micro_batches") is None for s in steps[1:])
    assert steps[6]["data_wait_s"] is not None


PEEKS_AT_EACH_EPOCH = """
import json, sys
import torch
from torch import nn

torch.manual_seed(0)
x = torch.cat([torch.arange(64.0)[:, None], torch.randn(64, 4)], 1)  # each row starts with its index
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.randint(0, 2, (64,))), batch_size=8,
                                     shuffle=True)
model = nn.Linear(5, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
seen = []
for epoch in range(3):
    b_sz = len(next(iter(loader))[0])  # pytorch/examples' DDP tutorial prints its batch size so, every epoch
    epoch_ids = []
    for inputs, labels in loader:
        epoch_ids.append(inputs[:, 0].long().tolist())
        opt.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        opt.step()
    seen.append(epoch_ids)
json.dump(seen, open(sys.argv[1], "w"))
"""


def test_a_batch_peeked_at_before_each_epoch_is_no_step_and_no_epoch(run_root: Path, socket_dir: Path, tmp_path: Path):
    # pytorch/examples' multigpu_torchrun.py reads its batch size off next(iter(loader)) before each epoch. That
    # batch folded into the epoch's first step (16 ids where 8 trained, its wait in the step's) and each peek
    # counted an epoch: the epochs read 0, 3, 5 for 0, 1, 2.
    steps, seen = steps_and_seen(PEEKS_AT_EACH_EPOCH, run_root, socket_dir, tmp_path)
    assert [s["step"] for s in steps] == list(range(24))
    # Step 0's batch was drawn before the first optimizer step made the Watch; every other step has its own.
    assert [s["batch_ids"] for s in steps[1:]] == [ids for epoch in seen for ids in epoch][1:]
    assert all(s.get("micro_batches") is None for s in steps)
    assert [s["epoch"] for s in steps] == [0] * 8 + [1] * 8 + [2] * 8


DRAWS_AFTER_ITS_LAST_STEP = """
import torch
from torch import nn

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
x, y = next(iter(loader))  # mnist_forward_forward: its test batch, the model still in training mode
print("accuracy", (model(x).argmax(1) == y).float().mean().item() >= 0)
"""


def test_a_batch_drawn_after_the_last_step_and_never_trained_on_is_no_step(
    run_root: Path, socket_dir: Path, tmp_path: Path
):
    script = tmp_path / "draws_after.py"
    script.write_text(DRAWS_AFTER_ITS_LAST_STEP)
    done = run([*TUIWATCH, "--run-dir", str(run_root), str(script)], socket_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "accuracy True\n"
    ledger = ledger_file(run_root)
    steps = records(ledger, "step")
    assert [s["step"] for s in steps] == list(range(8))  # the 8 optimizer steps, and no 9th without a loss
    assert all(s["loss"] is not None and s["opt_step"] == s["step"] + 1 for s in steps)
    end = records(ledger, "end")[-1]
    assert (end["reason"], end["steps"]) == ("finished", 8)


ENGINE_STYLE = """
import json
import sys

import torch
from torch import nn

# pytorch-ignite's Engine as create_supervised_trainer and create_supervised_evaluator use it: the engine draws a
# batch, then calls its process function, which sets the model's mode (the evaluator's: model.eval(), no_grad).
def run(process, loader):
    for batch in loader:
        process(batch)

torch.manual_seed(0)
x = torch.randn(96, 4)
x[:, 0] = torch.arange(96)  # a sample's input says which it is
data = torch.utils.data.TensorDataset(x, (x[:, 1] > 0).long())
train, val = torch.utils.data.random_split(data, [64, 32], generator=torch.Generator().manual_seed(0))
position = {index: i for i, index in enumerate(train.indices)}  # ids are indices into the loader's dataset
train_loader = torch.utils.data.DataLoader(train, batch_size=8, shuffle=True)
val_loader = torch.utils.data.DataLoader(val, batch_size=32 if sys.argv[2] == "one-val-batch" else 8)
model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.1), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = []

def train_step(batch):
    model.train()
    opt.zero_grad()
    inputs, labels = batch
    seen.append([position[int(i)] for i in inputs[:, 0]])
    nn.functional.cross_entropy(model(inputs), labels).backward()
    opt.step()

def evaluate_step(batch):
    model.eval()
    with torch.no_grad():
        model(batch[0])

for epoch in range(3):
    run(train_step, train_loader)
    if sys.argv[2] == "train-and-val":  # ignite's mnist example scores the training set too
        run(evaluate_step, train_loader)
    run(evaluate_step, val_loader)
json.dump(seen, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("evaluates", ["val", "one-val-batch", "train-and-val"])
def test_an_evaluator_that_draws_its_first_batch_before_model_eval_makes_no_step(
    run_root: Path, socket_dir: Path, tmp_path: Path, evaluates: str
):
    # pytorch-ignite's evaluator draws a batch before its step calls model.eval(): drawn in training mode, the first
    # batch of every evaluation opened a step, the next epoch's first batch folded into it (two micro-batches, the
    # evaluation in its compute time), and each evaluation of the training set began an epoch (0, 2, 4).
    steps, seen = steps_and_seen(ENGINE_STYLE, run_root, socket_dir, tmp_path, evaluates)
    assert [s["step"] for s in steps] == list(range(24))
    assert [s["epoch"] for s in steps] == [0] * 8 + [1] * 8 + [2] * 8
    # Step 0's batch was drawn before the first optimizer step made the Watch; every other step has its own.
    assert [s["batch_ids"] for s in steps[1:]] == seen[1:]
    assert all(s.get("micro_batches") is None and s["opt_step"] == s["step"] + 1 for s in steps)


CLIPS_BY_VALUE = """
import json
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.norms = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def on_before_optimizer_step(self, optimizer):  # before Lightning clips
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
data = TensorDataset(torch.randn(160, 8) * 20, torch.randint(0, 3, (160,)))
model = Classifier()
trainer = L.Trainer(
    max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, gradient_clip_val=0.05, gradient_clip_algorithm="value",
)
trainer.fit(model, DataLoader(data, batch_size=32))
json.dump(model.norms, open(sys.argv[1], "w"))
"""


def test_a_lightning_script_that_clips_by_value_records_the_norm_before_the_clip(
    run_root: Path, socket_dir: Path, tmp_path: Path
):
    # gradient_clip_algorithm="value" calls torch's clip_grad_value_ inside the closure the optimizer runs, before
    # tuiwatch run's Watch measured: the first step recorded 0.88 for a pre-clip norm of 9.1.
    pytest.importorskip("lightning")
    steps, norms = steps_and_seen(CLIPS_BY_VALUE, run_root, socket_dir, tmp_path)
    # Lightning's LightningOptimizer wraps the SGD, sharing its hook tables: one optimizer, not "SGD + LightningSGD"
    # with the lr twice and each hook put on twice.
    assert records(ledger_file(run_root), "run")[0]["optimizer"] == "SGD"
    assert [s["lr"] for s in steps] == [[0.05]] * 5
    assert len(steps) == len(norms) == 5
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms, rel=1e-5)
    assert min(norms) > 1  # each clipped to 0.05 an element, 0.05·√227 ≈ 0.75 at most after


CLIPS_IMPORTED_BY_NAME = """
import json, sys
import torch
from torch.nn.utils import clip_grad_norm_, clip_grad_value_  # bound before any Watch exists

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(48, 8) * 50, torch.randint(0, 2, (48,)))
norms = []
for x, y in torch.utils.data.DataLoader(data, batch_size=8):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
    if sys.argv[2] == "norm":
        clip_grad_norm_(model.parameters(), 0.5)
    elif sys.argv[2] == "deprecated":
        torch.nn.utils.clip_grad_norm(model.parameters(), 0.5)  # through torch.nn.utils.clip_grad's own name
    else:
        clip_grad_value_(model.parameters(), 0.01)
    opt.step()
    opt.zero_grad()
json.dump(norms, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("clip", ["norm", "deprecated", "value"])
def test_a_script_that_imported_the_clip_by_name_records_every_norm_before_the_clip(
    run_root: Path, socket_dir: Path, tmp_path: Path, clip: str
):
    # The clip wrappers came with the Watch, after the script had bound torch's own function: every step's norm
    # was the clipped one (0.5, flat: grad-explosion could never fire). Step 0's was too whatever the import, as
    # tuiwatch run makes its Watch inside the first optimizer step, after the script clipped.
    steps, norms = steps_and_seen(CLIPS_IMPORTED_BY_NAME, run_root, socket_dir, tmp_path, clip)
    assert len(steps) == len(norms) == 6
    assert [s["grad_norm"] for s in steps] == pytest.approx(norms, rel=1e-5)
    assert min(norms) > 5
    assert [s["grad_norm_clipped"] for s in steps] == ([None] * 6 if clip == "value" else [True] * 6)


SCRIPTED_AT_THE_END = """
import sys
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
x, y = torch.randn(128, 4), torch.randint(0, 3, (128,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
torch.jit.script(model).save(sys.argv[1])  # the export, last
"""


def test_a_script_that_exports_its_model_with_torchscript_at_the_end_saves_it(socket_dir: Path, tmp_path: Path):
    # The Watch stays attached until the script ends; torch.jit.script compiled its hook and raised after training.
    exported = tmp_path / "model.pt"
    ledger = run_source(SCRIPTED_AT_THE_END, tmp_path, socket_dir, str(exported))
    loaded = torch.jit.load(str(exported))
    assert loaded(torch.zeros(2, 4)).shape == (2, 3)
    steps = records(ledger, "step")
    assert [s["step"] for s in steps] == list(range(8))  # 2 epochs of 4 batches
    assert steps[0]["batch_shape"] is None  # drawn before the Watch was made
    assert steps[1]["batch_shape"] == [[32, 4], [32]]


def test_a_part_is_a_module_apart_from_the_model_else_the_line_says_what_is_not_watched():
    # The first step's backward filled the gradients of another optimizer's parameters. Held by a module apart from
    # the model, that module is a part; a plain tensor no module holds is not, and the line names what is left out.
    torch.manual_seed(0)
    model, decoder, scale = nn.Linear(4, 3), nn.Linear(3, 2), torch.ones(2, requires_grad=True)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    by_decoder, by_scale = torch.optim.SGD(decoder.parameters(), lr=0.1), torch.optim.SGD([scale], lr=0.1)
    (decoder(model(torch.randn(5, 4))) * scale).sum().backward()
    objects: list[Any] = [model, decoder, scale, first, by_decoder, by_scale]
    assert parts_of_the_same_backward(model, [by_decoder], [], objects) == [decoder]
    assert parts_of_the_same_backward(model, [by_decoder, by_scale], [], objects) == []
    line = same_backward_elsewhere(model, [by_scale], [])
    assert line is not None
    assert line.startswith("the same backward filled the gradients of 2 parameters outside Linear that another")
    whole = ModelOfParts([model, decoder])
    assert [name for name, _ in whole.named_children()] == ["Linear", "Linear_"]
    assert steps_beside(whole, [by_decoder, by_scale]) == [by_decoder]


STATEFUL_LOADER = """
import json, sys
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.arange(96).float().unsqueeze(1), torch.zeros(96, dtype=torch.long))
loader = StatefulDataLoader(data, batch_size=8, shuffle=True, num_workers=int(sys.argv[2]))
mode = sys.argv[3]
if mode == "resume":
    loader.load_state_dict(torch.load(sys.argv[4]))
model = nn.Linear(1, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
drawn = []
for epoch in range(1 if mode == "resume" else 2):
    for x, y in loader:
        drawn.append([int(v) for v in x[:, 0]])
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if mode == "save" and len(drawn) == 5:
            torch.save(loader.state_dict(), sys.argv[4])
            break
    if mode == "save":
        break
json.dump(drawn, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_stateful_loaders_steps_have_their_ids_fresh_and_resumed_mid_epoch(
    socket_dir: Path, tmp_path: Path, workers: str
):
    """torchdata's StatefulDataLoader makes its iterator in an ``__iter__`` of its own, never torch's, where the run
    put the id recorder: its steps had no ids. Step 0 is the Watch's first (made inside it): no batch facts."""
    snapshot = str(tmp_path / "state.pt")
    for mode, runs, batches in (("fresh", "fresh", 24), ("save", "saved", 5), ("resume", "resumed", 7)):
        truth = tmp_path / f"{mode}.json"
        steps = records(
            run_source(STATEFUL_LOADER, tmp_path, socket_dir, str(truth), workers, mode, snapshot, runs=runs), "step"
        )
        drawn = json.loads(truth.read_text())
        assert len(drawn) == len(steps) == batches, mode
        assert [s["batch_ids"] for s in steps[1:]] == drawn[1:], mode
    # The resumed job drew the epoch's last seven batches, as it does unwatched (the saved state is the same).
    plain = tmp_path / "plain.json"
    done = run([sys.executable, str(tmp_path / "script.py"), str(plain), workers, "resume", snapshot], socket_dir)
    assert done.returncode == 0, done.stderr
    assert json.loads(plain.read_text()) == drawn
