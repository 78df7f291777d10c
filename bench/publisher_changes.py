"""Each change of issue 18 against the code it replaced, side by side in one process.

For every change the old version is kept here, next to a call of the new one
in the package, and both are timed in alternating rounds on the same inputs,
inside a real training loop where the change runs there (the same code costs
two to three times more between a model's kernels than in a tight loop: caches
and branch predictors are cold). The clock is the calling thread's own CPU
time (``time.thread_time``); the idle figures read the publisher thread's from
``/proc/self/task/<tid>/schedstat``. Prints one row per change: old, new,
saved, which thread pays it, and the method; the load average is printed at
start and end.

    python bench/publisher_changes.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import torch
from overhead import learning, publisher_cpu  # a sibling script: bench/ is on the path when this one runs
from torch import nn

from tuiwatch.ledger.codec import _has_nonfinite
from tuiwatch.ledger.fields import num
from tuiwatch.publisher.background import pipeline as pipeline_module
from tuiwatch.publisher.background import system as system_module
from tuiwatch.publisher.background.system import child_pids
from tuiwatch.publisher.deferred import defer, resolve
from tuiwatch.publisher.hooks import ModelHooks
from tuiwatch.publisher.measure import BatchInfo, _shape_and_tensors, total_norm
from tuiwatch.publisher.pending import MAX_RECORD_IDS, _batch_totals, _is_finite, ids_digest
from tuiwatch.publisher.watch import Watch
from tuiwatch.rules import Diagnosis
from tuiwatch.rules.loss import LossChance
from tuiwatch.rules.optimizer import LrZero

Row = tuple[str, float, float, str, str]  # change, old µs, new µs, thread, method

# --- the old versions ------------------------------------------------------------------------------------


def old_has_nonfinite(obj: Any) -> bool:
    if type(obj) is float:
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(old_has_nonfinite(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(old_has_nonfinite(v) for v in obj)
    return False


def old_total_norm(tensors: list[torch.Tensor]) -> Any:
    with torch.no_grad():
        norms = torch._foreach_norm(list(tensors))
        return math.sqrt(math.fsum(n.item() ** 2 for n in norms))


class OldBatchInfo:
    """measure.BatchInfo before issue 18, as it was."""

    __slots__ = ("finite_probe", "nbytes", "shape", "size", "tokens")

    def __init__(self, batch: Any):
        tensors: list[torch.Tensor] = []
        self.shape = _shape_and_tensors(batch, tensors)
        self.nbytes = sum(t.nbytes for t in tensors)
        first = tensors[0] if tensors else None
        self.size: int | None = int(first.shape[0]) if first is not None and first.dim() else None
        probe: torch.Tensor | None = None
        for t in tensors:
            if t.is_floating_point():
                t = t.detach()
                value = t.sum() if t.dtype in (torch.float32, torch.float64) else t.sum(dtype=torch.float32)
                probe = value if probe is None else probe + value
        self.finite_probe: Any = None if probe is None else defer(probe)
        self.tokens: Any = None
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        if isinstance(mask, torch.Tensor):
            self.tokens = defer(mask.sum())
        elif first is not None and first.dim() >= 2 and not first.is_floating_point() and not first.is_complex():
            self.tokens = first.numel()


def old_lr_zero(rule: Any, lr: list[float]) -> bool:
    values = [num(v) for v in lr]
    if len(rule.peak) != len(values):
        rule.peak = [0.0] * len(values)
    rule.peak = [max(p, abs(v or 0.0)) for p, v in zip(rule.peak, values, strict=True)]
    return all(v == 0 or abs(v or 0.0) <= rule.collapse * p for v, p in zip(values, rule.peak, strict=True))


def old_build(self: Any) -> Any:
    """StepState.build before issue 18: two dicts, every value through resolve()."""
    t = self.t_end or time.time()
    # On the line, the user's metrics come right after the step's identity.
    line: dict[str, Any] = {"kind": "step", "t": t, "step": self.step, "epoch": self.epoch}
    for name, value in self.metrics.items():
        line[name] = resolve(value)
    grad_norm = resolve(self.grad_norm)
    batch = self.batch
    batch_size, tokens, batch_probe = _batch_totals(self.batches())
    compute_s = resolve(self.compute_s)
    total_s = (self.data_wait_s or 0.0) + (compute_s or 0.0)
    mem = self.mem
    forward_probe = resolve(self.forward_probe)
    param_norm = resolve(self.param_norm)
    finite = {
        "batch": True if batch is not None and batch_probe is None else _is_finite(batch_probe),
        "forward": _is_finite(forward_probe),
        "loss": _is_finite(line.get("loss")),
        "grad": _is_finite(grad_norm),
        "param": _is_finite(param_norm),
    }
    record: dict[str, Any] = {
        "kind": "step",
        "t": t,
        "step": self.step,
        "epoch": self.epoch,
        "lr": resolve(self.lr),
        "grad_norm": grad_norm,
        "grad_norm_clipped": (
            None
            if self.clip_max_norm is None or grad_norm is None
            else bool(grad_norm > self.clip_max_norm or not math.isfinite(grad_norm))
        ),
        "param_norm": param_norm,
        "update_norm": resolve(self.update_norm),
        "opt_step": self.opt_step,
        "batch_ids": self.batch_ids,
        "batch_shape": batch.shape if batch is not None else None,
        "tokens": tokens,
        "data_wait_s": self.data_wait_s,
        "compute_s": compute_s,
        "examples_per_s": batch_size / total_s if batch_size and total_s > 0 else None,
        "mem_allocated": mem.allocated if mem else None,
        "mem_reserved": mem.reserved if mem else None,
        "mem_peak": mem.peak if mem else None,
        "finite": finite,
        "training": self.training,
    }
    if self.opt_skipped:
        record["opt_skipped"] = True
    if self.oom is not None:
        record["oom"] = self.oom
    if self.classes is not None:
        record["classes"] = self.classes
    if self.micro_batches > 1:
        record["micro_batches"] = self.micro_batches
    if self.batch_ids is not None and len(self.batch_ids) > MAX_RECORD_IDS:
        record["batch_ids"] = self.batch_ids[:MAX_RECORD_IDS]
        record["batch_ids_count"] = len(self.batch_ids)
        record["batch_ids_digest"] = ids_digest(self.batch_ids)
    if self.scale is not None:
        record["scale"] = resolve(self.scale)
    line.update(record)
    return line


# --- timing -------------------------------------------------------------------------------------------------


def tiny() -> tuple[nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    data = [(x, (x[:, 0] > 0).long()) for x in (torch.randn(64, 2, generator=g) for _ in range(50))]
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), data


def in_loop(
    old: Callable[..., Any], new: Callable[..., Any], where: str, rounds: int, steps: int = 400
) -> tuple[float, float]:
    """Median µs a call of ``old`` and of ``new``, called at ``where`` ("batch" or "grads") of a tiny MLP's steps."""
    model, opt, data = tiny()
    params = list(model.parameters())
    results: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(rounds):
        for name, fn in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            spent = 0.0
            for i in range(steps):
                x, y = data[i % 50]
                if where == "batch":
                    t0 = time.thread_time()
                    fn((x, y))
                    spent += time.thread_time() - t0
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if where == "grads":
                    grads = [p.grad for p in params if p.grad is not None]
                    t0 = time.thread_time()
                    fn(grads)
                    spent += time.thread_time() - t0
                opt.step()
                opt.zero_grad(set_to_none=True)
            results[name].append(spent / steps * 1e6)
    return statistics.median(results["old"]), statistics.median(results["new"])


def alternating(old: Callable[[], Any], new: Callable[[], Any], rounds: int, calls: int) -> tuple[float, float]:
    results: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(rounds):
        for name, fn in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            t0 = time.thread_time()
            for _ in range(calls):
                fn()
            results[name].append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(results["old"]), statistics.median(results["new"])


STEP_RECORD = {
    "kind": "step", "t": 1796228582.64, "step": 31, "epoch": 1, "loss": 0.2412, "lr": [0.1], "grad_norm": 0.2487,
    "grad_norm_clipped": False, "param_norm": 4.3966, "update_norm": None, "opt_step": 32,
    "batch_ids": list(range(64)), "batch_shape": [[64, 2], [64]], "tokens": None, "data_wait_s": 0.000134,
    "compute_s": 0.000353, "examples_per_s": 8213.5, "mem_allocated": None, "mem_reserved": None,
    "mem_peak": None, "finite": {"batch": True, "forward": True, "loss": True, "grad": True, "param": True},
    "training": True,
}  # fmt: skip


class OldLossChance(LossChance):
    """loss-chance before: while active, the losses since it fired copied and sorted at every step record."""

    def clears(self, record: Any) -> bool:
        chance = self._push(record)
        if chance is None:
            return False
        since = list(self.recent)[-max(self.since_fired, self.jump) :]
        return statistics.median(since) < (1 - 2 * self.tolerance) * chance


def at_chance(n: int) -> list[dict[str, Any]]:
    """Step records of a classifier that never learns (its loss at ln 2): loss-chance fires at 199 and stays."""
    noise = [math.sin(i * 12.9898) * 0.01 for i in range(n)]
    return [
        {"kind": "step", "step": i, "loss": math.log(2) + noise[i], "lr": [0.1], "grad_norm": 1.0, "classes": 2}
        for i in range(n)
    ]


def fed_row(change: str, method: str, records: list[dict[str, Any]], old: Any, new: Any, rounds: int) -> Row:
    """µs a record of feeding ``records`` to a fresh ``old()`` and a fresh ``new()`` (a rule or the Diagnosis)."""

    def feed(make: Any) -> None:
        fed = make()
        observe = fed.observe if hasattr(fed, "observe") else fed.feed
        for r in records:
            observe(r)

    was, now = alternating(lambda: feed(old), lambda: feed(new), rounds, 5)
    return (change, was / len(records), now / len(records), "publisher", method)


class OldDiagnosis(Diagnosis):
    """The rules fed before: every rule through its observe(), which calls its check()."""

    def feed(self, record: Any) -> list[Any]:
        out = []
        for rule, _ in self._by_kind.get(record.get("kind"), ()):
            found = rule.observe(record)
            if found is not None:
                out.append(found)
        return out


def captured_steps(n: int) -> list[Any]:
    """The StepStates a default Watch hands its publisher thread over ``n`` steps of the tiny MLP."""
    model, opt, data = tiny()
    watch = Watch(model, opt, run_dir=None, quiet=True)
    captured: list[Any] = []
    watch._pipeline.put = captured.append  # type: ignore[method-assign,assignment]
    for x, y in watch.batches(data[i % 50] for i in range(n)):
        loss = nn.functional.cross_entropy(model(x), y)
        watch.log(loss=loss)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    watch.close()
    return [c for c in captured if not isinstance(c, dict)]


def update_norm_rows(rounds: int) -> tuple[float, float]:
    """µs of snapshot + update norm a sampled step of the 3x512 MLP (the optimizer step between them included)."""
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))

    def old() -> Any:
        with torch.no_grad():
            before = list(torch._foreach_mul(params, 1.0))
        opt.step()
        with torch.no_grad():
            return total_norm(torch._foreach_sub(params, before))

    class Holder:
        _kept_snapshot = None

    holder = Holder()

    def new() -> Any:
        before = ModelHooks._snapshot(holder, params)  # type: ignore[arg-type]
        opt.step()
        return None if before is None else ModelHooks._update_norm(before)

    results: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(rounds):
        for name, fn in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            spent = 0.0
            for _ in range(10):
                nn.functional.cross_entropy(model(x), y).backward()
                t0 = time.thread_time()
                fn()
                spent += time.thread_time() - t0
                opt.zero_grad()
            results[name].append(spent / 10 * 1e6)
    return statistics.median(results["old"]), statistics.median(results["new"])


def thread_cpu(thread: Any) -> float:
    """Seconds on the CPU so far of one thread (schedstat: ns)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def batched_cycles_rows(rounds: int) -> list[Row]:
    """The publisher thread's CPU a step: woken every 20 ms, against every 100 ms or when a dump could lose a batch.

    Two Watches on copies of one model, the old one with the old period and no wake-up, run in alternating
    rounds; each round ends with every record written (``sync``). Also the training thread's CPU a step.
    """
    rows: list[Row] = []
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    big = nn.Sequential(*layers, nn.Linear(512, 10))
    cases = [("tiny MLP", tiny()[0], 64, 2, 2, 2000), ("3x512 MLP", big, 256, 512, 10, 200)]
    for label, model, batch, width, classes, steps in cases:
        g = torch.Generator().manual_seed(0)
        data = [(torch.randn(batch, width, generator=g), torch.randint(0, classes, (batch,), generator=g))]
        arms = {}
        for name in ("old", "new"):
            m = copy.deepcopy(model)
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            watch = Watch(m, opt, run_dir=tempfile.mkdtemp(), quiet=True, system=False)
            if name == "old":
                watch._pipeline.period_s = 0.02
                watch._pipeline.buffer.on_wake = None
            arms[name] = (m, opt, watch)
        background: dict[str, list[float]] = {"old": [], "new": []}
        training: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(rounds + 1):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                m, opt, watch = arms[name]
                thread = watch._pipeline._thread
                c0, t0 = thread_cpu(thread), time.thread_time()
                for x, y in watch.batches(data[0] for _ in range(steps)):
                    loss = nn.functional.cross_entropy(m(x), y)
                    watch.log(loss=loss)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                t1 = time.thread_time()
                watch._pipeline.sync(30)
                if r:  # the first round warms up
                    background[name].append((thread_cpu(thread) - c0) / steps * 1e6)
                    training[name].append((t1 - t0) / steps * 1e6)
        for _, _, watch in arms.values():
            watch.close()
        med = {k: statistics.median(v) for k, v in background.items()}
        change = (
            f"records taken 10 times a second (sooner before a dump's batch would leave), not every 20 ms ({label})"
        )
        rows.append((change, med["old"], med["new"], "publisher", f"{steps}-step rounds, schedstat"))
        med = {k: statistics.median(v) for k, v in training.items()}
        rows.append((f"... the training thread meanwhile ({label})", med["old"], med["new"], "training", "same rounds"))
    return rows


def idle_ms_per_s(seconds: float) -> tuple[float, float]:
    """The publisher thread's CPU per second of an idle run: the fixed 20 ms period and a system sample every
    second, against the doubling period and a sample every third second while idle."""
    out = []
    for idle, factor in ((0.02, 1), (pipeline_module.IDLE_WAIT_S, system_module.IDLE_FACTOR)):
        pipeline_module.IDLE_WAIT_S, system_module.IDLE_FACTOR = idle, factor
        model = nn.Linear(2, 2)
        watch = Watch(model, run_dir=tempfile.mkdtemp(), quiet=True)
        time.sleep(1.0)
        c0, t0 = publisher_cpu(), time.monotonic()
        time.sleep(seconds)
        out.append((publisher_cpu() - c0) / (time.monotonic() - t0) * 1e3)
        watch.close()
    return out[0], out[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--idle-s", type=float, default=10.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    rows: list[Row] = []
    old, new = alternating(
        lambda: old_has_nonfinite(STEP_RECORD), lambda: _has_nonfinite(STEP_RECORD), args.rounds, 20000
    )
    rows.append(("non-finite scan of a step record before encoding", old, new, "publisher", "one record, tight loop"))
    states = captured_steps(600)
    old, new = alternating(lambda: [old_build(s) for s in states], lambda: [s.build() for s in states], args.rounds, 5)
    rows.append(("build a step record: one dict, numbers not resolved", old / 600, new / 600, "publisher", "600 steps"))
    old, new = in_loop(old_total_norm, total_norm, "grads", args.rounds)
    rows.append(("gradient norm without a no_grad() block", old, new, "training", "tiny MLP, in the loop"))
    old, new = in_loop(OldBatchInfo, BatchInfo, "batch", args.rounds)
    rows.append(("batch probe: no detach, one walk", old, new, "training", "tiny MLP, in the loop"))
    rule_old, rule_new, lr = LrZero(), LrZero(), [0.1, 0.01]
    step = {"kind": "step", "opt_step": 1, "lr": lr}
    old, new = alternating(lambda: old_lr_zero(rule_old, lr), lambda: rule_new._zero(step), args.rounds, 20000)
    rows.append(("lr-zero: an unchanged lr list answered from the last answer", old, new, "publisher", "tight loop"))
    change = "loss-chance: the losses since it fired kept sorted"
    method = "1,000 step records at chance (active from 199), a fresh rule each pass"
    rows.append(fed_row(change, method, at_chance(1000), OldLossChance, LossChance, args.rounds))
    change = "rules: check() called from the feed for a rule with no episode active"
    method = "1,000 step records of a run that learns (no alert), the fourteen rules, fresh each pass"
    rows.append(fed_row(change, method, learning(1000), OldDiagnosis, Diagnosis, args.rounds))
    model, _, _ = tiny()
    params = list(model.parameters())
    calls = [0]

    def every_10th(_: Any) -> Any:
        calls[0] += 1
        return total_norm(params) if calls[0] % 10 == 1 else None

    old, new = in_loop(lambda _: old_total_norm(params), every_10th, "grads", args.rounds)
    rows.append(("parameter norm every 10th step, averaged over steps", old, new, "training", "tiny MLP, in the loop"))
    me = psutil.Process()
    workers = [subprocess.Popen(["sleep", "30"]) for _ in range(4)]
    try:
        old, new = alternating(lambda: me.children(recursive=False), child_pids, args.rounds, 200)
    finally:
        for w in workers:
            w.kill()
    hosts = f"{len(psutil.pids())} processes on the host"
    rows.append((f"loader workers from /proc/self/task/*/children ({hosts})", old, new, "publisher", "one sample"))
    old, new = update_norm_rows(max(4, args.rounds // 2))
    rows.append(("update norm into kept buffers (3x512 MLP, a sampled step)", old, new, "training", "in the loop"))
    rows += batched_cycles_rows(args.rounds)
    idle_old, idle_new = idle_ms_per_s(args.idle_s)
    load_end = os.getloadavg()
    print(f"torch {torch.__version__}, 1 intra-op thread, {args.rounds} alternating rounds")
    print(f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end (1-minute, {os.cpu_count()} CPUs)\n")
    print("| change | old µs | new µs | saved µs | thread | method |\n|---|---|---|---|---|---|")
    for change, old, new, thread, method in rows:
        print(f"| {change} | {old:.1f} | {new:.1f} | {old - new:.1f} | {thread} | {method} |")
    idle = f"idle run: the publisher thread sleeps up to {pipeline_module.IDLE_WAIT_S} s, samples every 3rd s"
    print(
        f"| {idle} | {idle_old:.2f} ms/s | {idle_new:.2f} ms/s | {idle_old - idle_new:.2f} ms/s | publisher "
        f"| {args.idle_s:g} s idle, schedstat |"
    )


if __name__ == "__main__":
    main()
