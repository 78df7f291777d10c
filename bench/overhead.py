"""What a default Watch costs a training loop, measured side by side in one process.

Interleaved A/B: each round runs the bare loop and the watched loop (same
model copy, same batches, alternating which goes first), so drift and noise
hit both arms alike, and the result is the median over rounds of the paired
difference (watched - bare in the same round), with its interquartile range.
Two clocks: wall time per step, and the training thread's own CPU time per
step (``time.thread_time``), which other processes on a shared machine disturb
far less. torch runs one intra-op thread unless ``--threads`` says otherwise,
so that the thread CPU clock sees all of the step. Then an instrumented pass that splits the training thread's cost into
publishing and measurement, the CPU the background thread spends per record,
and RSS growth extrapolated to 100k steps. Absolute times on a shared 2-core
machine mean little; the ratios are the result.

    python bench/overhead.py [--rounds 9] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from learnable import teacher_labels
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.writer import MemoryTail
from tuiwatch.publisher import measure
from tuiwatch.publisher.background.pipeline import Pipeline
from tuiwatch.publisher.watch import Watch
from tuiwatch.rules import Diagnosis

BARS = {"publish_p50_us": 5.0, "publish_p99_us": 20.0, "measure_tiny_us": 30.0, "cpu_per_record_us": 10.0}


@dataclass
class Case:
    name: str
    make_model: Callable[[], nn.Module]
    batch: int
    in_shape: tuple[int, ...]
    classes: int
    steps_per_round: int


CASES = [
    Case(
        "mlp 2-32-2, batch 64", lambda: nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2)), 64, (2,), 2, 3000
    ),
    Case(
        "mlp 3x512, batch 256",
        lambda: nn.Sequential(
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        ),
        256,
        (512,),
        10,
        300,
    ),
    Case(
        "cnn 32x32, batch 64",
        lambda: nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 8 * 8, 10),
        ),
        64,
        (3, 32, 32),
        10,
        150,
    ),
]


def loader_for(case: Case, batches: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    n = case.batch * batches
    x = torch.randn(n, *case.in_shape, generator=g)
    y = teacher_labels(x, case.classes, g)  # a healthy run, as a user's is: no rule stays active on it
    return DataLoader(TensorDataset(x, y), batch_size=case.batch, shuffle=True, generator=g)


def cycle(loader: DataLoader[Any], steps: int) -> Iterator[Any]:
    n = 0
    while True:
        for batch in loader:
            yield batch
            n += 1
            if n >= steps:
                return


def publisher_cpu() -> float:
    """Seconds on the CPU so far of the Watch's publisher threads (schedstat: ns, where psutil has 10 ms ticks)."""
    total = 0
    for t in threading.enumerate():
        if t.name.startswith("tuiwatch-publisher"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


def floor_loop(model: nn.Module, opt: Any, loss_fn: Any, batches: Iterator[Any], ledger: list[dict[str, Any]]) -> None:
    """The floor: the Watch's per-step fields measured by hand, kept in a list (no rules, socket, sampler, file)."""
    params = list(model.parameters())
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches):
        t1 = time.perf_counter()
        batch_probe = x.sum().item()
        out = model(x)
        forward_probe = out.detach().sum().item()
        loss = loss_fn(out, y)
        loss.backward()
        norms = torch._foreach_norm([p.grad for p in params if p.grad is not None])
        grad_norm = math.sqrt(math.fsum(n.item() ** 2 for n in norms))
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        ledger.append(
            {
                "step": step,
                "loss": loss.item(),
                "lr": [g["lr"] for g in opt.param_groups],
                "grad_norm": grad_norm,
                "batch_shape": [list(x.shape), list(y.shape)],
                "data_wait_s": t1 - t0,
                "compute_s": t2 - t1,
                "finite": (batch_probe, forward_probe),
            }
        )
        t0 = t2


class Arm:
    def __init__(self, case: Case, kind: str, run_dir: Path, model: nn.Module):
        self.kind = kind  # "bare", "watched" or "floor"
        self.model = copy.deepcopy(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.watch = (
            Watch(self.model, self.opt, name="bench", run_dir=run_dir, quiet=True) if kind == "watched" else None
        )
        self.background: list[float] = []  # the publisher thread's CPU seconds per step, per run

    def run(self, loader: DataLoader[Any], steps: int) -> tuple[float, float]:
        """Wall seconds and training-thread CPU seconds per step over ``steps`` steps."""
        model, opt, loss_fn, watch = self.model, self.opt, self.loss_fn, self.watch
        batches = cycle(loader, steps)
        gc.collect()
        background = publisher_cpu()
        cpu_start = time.thread_time()
        start = time.perf_counter()
        if self.kind == "floor":
            floor_loop(model, opt, loss_fn, batches, [])
        elif watch is None:
            for x, y in batches:
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            for x, y in watch.batches(batches):
                loss = loss_fn(model(x), y)
                watch.log(loss=loss)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        wall, cpu = (time.perf_counter() - start) / steps, (time.thread_time() - cpu_start) / steps
        if watch is not None:
            watch._pipeline.sync(30)  # what these steps cost the publisher thread, every record of them written
            self.background.append((publisher_cpu() - background) / steps)
        return wall, cpu


@dataclass
class Paired:
    wall: dict[str, list[float]]  # per arm kind, seconds per step, one per round
    cpu: dict[str, list[float]]
    background: list[float]  # the publisher thread's CPU seconds per step, one per round
    alerts: list[str] = field(default_factory=list)  # the watched arm's warning and critical alerts: rule@step

    def added(self, clock: str, kind: str = "watched") -> tuple[float, float, float]:
        """Median added seconds per step over the bare loop of the same round, and its interquartile range."""
        series = self.wall if clock == "wall" else self.cpu
        return iqr([w - x for x, w in zip(series["bare"], series[kind], strict=True)])


def iqr(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` and its interquartile range."""
    d = sorted(values)
    return statistics.median(d), d[len(d) // 4], d[(3 * len(d)) // 4]


@dataclass
class TinyBench:
    """A side-by-side benchmark on the tiny MLP: its arguments, the case, a run directory, the model every arm
    copies, and the batches they all train on."""

    rounds: int
    steps: int
    case: Case
    run_dir: Path
    model: nn.Module
    loader: DataLoader[Any]


def tiny_bench(doc: str, rounds: int) -> TinyBench:
    """Parse ``--rounds`` and ``--steps``, set one torch thread, say the load average, and build the tiny MLP."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    torch.set_num_threads(1)
    case = CASES[0]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {case.name}, {args.rounds} rounds of {args.steps} steps")
    torch.manual_seed(0)
    return TinyBench(args.rounds, args.steps, case, Path(tempfile.mkdtemp()), case.make_model(), loader_for(case, 50))


def rotating_rounds(
    arms: dict[str, Arm], loader: DataLoader[Any], rounds: int, steps: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each arm's wall and training-thread CPU seconds a step, one of each a round, after a warm-up run; the arms'
    order rotates round by round, so that none always runs first (or after the same one)."""
    for arm in arms.values():
        arm.run(loader, steps // 5)  # warm-up
    wall: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    order = list(arms)
    for r in range(rounds):
        for kind in order[r % len(order) :] + order[: r % len(order)]:
            w, c = arms[kind].run(loader, steps)
            wall[kind].append(w)
            cpu[kind].append(c)
    return wall, cpu


def print_added(wall: dict[str, list[float]], cpu: dict[str, list[float]], bare: str = "bare") -> None:
    """Each arm's added wall and training-thread CPU a step over ``bare``: the median of the paired differences,
    with the interquartile range."""
    print(f"{bare} step: {statistics.median(wall[bare]) * 1e6:.0f} µs wall")
    print(f"{'arm':<10}{'added wall µs':>24}{'added training-thread CPU µs':>34}")
    for kind in (k for k in wall if k != bare):
        aw = iqr([(x - b) * 1e6 for x, b in zip(wall[kind], wall[bare], strict=True)])
        ac = iqr([(x - b) * 1e6 for x, b in zip(cpu[kind], cpu[bare], strict=True)])
        print(f"{kind:<10}{aw[0]:>10.1f} [{aw[1]:6.1f}, {aw[2]:6.1f}]{ac[0]:>20.1f} [{ac[1]:6.1f}, {ac[2]:6.1f}]")


def ab(case: Case, rounds: int, run_dir: Path) -> Paired:
    torch.manual_seed(0)
    model = case.make_model()
    loader = loader_for(case, 50)
    arms = [Arm(case, kind, run_dir, model) for kind in ("bare", "watched", "floor")]
    for arm in arms:
        arm.run(loader, case.steps_per_round // 5)  # warm-up
    result = Paired({a.kind: [] for a in arms}, {a.kind: [] for a in arms}, [])
    for r in range(rounds):
        shift = r % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            w, c = arm.run(loader, case.steps_per_round)
            result.wall[arm.kind].append(w)
            result.cpu[arm.kind].append(c)
    watched = arms[1]
    result.background = watched.background[1:]  # the warm-up run left out
    assert watched.watch is not None
    watched.watch.close()
    ledger = watched.watch.ledger_path
    if ledger is not None:
        result.alerts = [
            f"{r['rule']}@{r['step']}"
            for r in read_ledger(ledger)
            if r.get("kind") == "alert" and r.get("severity") != "info"
        ]
    return result


def instrumented(case: Case, run_dir: Path, steps: int) -> dict[str, Any]:
    """Per-step publishing and measurement time on the training thread, and the background thread's CPU."""
    torch.manual_seed(0)
    arm = Arm(case, "watched", run_dir, case.make_model())
    watch = arm.watch
    assert watch is not None
    publish: list[float] = []
    measured: list[float] = []
    clock = time.perf_counter

    def timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                sink.append(clock() - t0)

        return wrapper

    # Publishing: what the training thread does to hand a step over (the tracker opens and ends steps).
    tracker = watch._tracker
    tracker.end = timed(tracker.end, publish)  # type: ignore[method-assign]
    watch.log = timed(watch.log, publish)  # type: ignore[method-assign]
    tracker.open = timed(tracker.open, publish)  # type: ignore[method-assign]
    # Measurements: norms, finiteness probes, batch shapes. The hooks were registered with the
    # bound methods: detach them, time them, attach the timed ones.
    hooks = watch._hooks
    hooks.remove()
    for name in ("before_optimizer_step", "after_optimizer_step", "after_forward"):
        setattr(hooks, name, timed(getattr(hooks, name), measured))
    hooks.attach()
    orig_batch_info = measure.BatchInfo
    import tuiwatch.publisher.steps as steps_module

    steps_module.BatchInfo = lambda *a: _timed_call(orig_batch_info, a, measured)  # type: ignore[assignment,misc]
    loader = loader_for(case, 50)
    arm.run(loader, 200)
    publish.clear()
    measured.clear()
    arm.run(loader, steps)
    watch.close()
    steps_module.BatchInfo = orig_batch_info  # type: ignore[misc]
    per_step_publish = _per_step(publish, 3)  # open + log + end per step
    per_step_measure = _per_step(measured, 4)  # batch info, forward, pre, post
    return {
        "publish_p50_us": _pct(per_step_publish, 50) * 1e6,
        "publish_p99_us": _pct(per_step_publish, 99) * 1e6,
        "measure_p50_us": _pct(per_step_measure, 50) * 1e6,
    }


def _timed_call(fn: Callable[..., Any], args: tuple[Any, ...], sink: list[float]) -> Any:
    t0 = time.perf_counter()
    try:
        return fn(*args)
    finally:
        sink.append(time.perf_counter() - t0)


def _per_step(samples: list[float], calls_per_step: int) -> list[float]:
    return [sum(samples[i : i + calls_per_step]) for i in range(0, len(samples) - calls_per_step + 1, calls_per_step)]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def background_cost(case: Case, records: int) -> float:
    """µs of pipeline-thread work per step record (resolve, build, rules, encode, append), timed alone."""
    torch.manual_seed(0)
    arm = Arm(case, "watched", Path(tempfile.mkdtemp()), case.make_model())
    watch = arm.watch
    assert watch is not None
    captured: list[Any] = []
    watch._pipeline.put = captured.append  # type: ignore[method-assign,assignment]
    arm.run(loader_for(case, 50), records)
    watch._pipeline.put = Pipeline.put.__get__(watch._pipeline)  # type: ignore[method-assign]
    watch.close()
    pipeline = Pipeline(
        MemoryTail(max_bytes=64 << 20), capacity=records + 1, system_interval_s=None, diagnosis=Diagnosis()
    )
    for item in captured:
        pipeline.put(item)
    t0 = time.thread_time()
    pipeline._drain(final=True)
    return (time.thread_time() - t0) / len(captured) * 1e6


def learning(n: int) -> list[dict[str, Any]]:
    """Step records of a run that learns, with every field the rules read (the norms every 10th step)."""
    noise = [math.sin(i * 12.9898) * 0.01 for i in range(n)]
    return [
        {
            "kind": "step",
            "step": i,
            "epoch": i // 100,
            "loss": 1.0 / (1 + i / 100) + noise[i],
            "lr": [0.1],
            "grad_norm": 1.0 + noise[i],
            "opt_step": i + 1,
            "data_wait_s": 0.0002,
            "compute_s": 0.0004,
            "param_norm": 4.0 + i * 1e-3 if i % 10 == 0 else None,
            "update_norm": 0.05 if i % 10 == 0 else None,
            "finite": {"batch": True, "forward": True, "loss": True, "grad": True, "param": True},
            "training": True,
            "classes": 2 if i == 0 else None,
        }
        for i in range(n)
    ]


def rules_cost(records: list[dict[str, Any]], passes: int = 9) -> float:
    """µs of the fourteen rules a step record: ``records`` fed to a fresh Diagnosis, the median of ``passes``."""
    per_record = []
    for _ in range(passes):
        feed = Diagnosis().feed
        t0 = time.thread_time()
        for record in records:
            feed(record)
        per_record.append((time.thread_time() - t0) / len(records) * 1e6)
    return statistics.median(per_record)


def rss_growth_per_100k(case: Case, steps: int, run_dir: Path) -> float:
    torch.manual_seed(0)
    arm = Arm(case, "watched", run_dir, case.make_model())
    loader = loader_for(case, 50)
    arm.run(loader, 2000)
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    arm.run(loader, steps)
    gc.collect()
    rss1 = psutil.Process().memory_info().rss
    assert arm.watch is not None
    arm.watch.close()
    return (rss1 - rss0) / steps * 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="fewer steps, for a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scale = 0.2 if args.quick else 1.0
    run_dir = Path(tempfile.mkdtemp(prefix="tuiwatch-bench-"))
    load_start = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), {args.rounds} rotating rounds")
    print("added = median over rounds of (arm - bare) in the same round, [interquartile range];")
    print("floor = the same per-step fields measured by hand into a list (no rules, socket, sampler or file)\n")
    print(
        f"{'model':<22} {'bare µs':>8} {'added wall µs':>20} {'added %':>8} {'train CPU µs':>18} "
        f"{'floor wall/CPU µs':>18} {'publisher µs/step':>18} {'publish p50/p99':>16} {'measure':>8}"
    )
    results = {}
    alerts: dict[str, list[str]] = {}
    for case in CASES:
        case.steps_per_round = max(20, int(case.steps_per_round * scale))
        paired = ab(case, args.rounds, run_dir)
        b = statistics.median(paired.wall["bare"])
        added, lo, hi = paired.added("wall")
        added_cpu, clo, chi = paired.added("cpu")
        floor, _, _ = paired.added("wall", "floor")
        floor_cpu, _, _ = paired.added("cpu", "floor")
        background = statistics.median(paired.background)
        inst = instrumented(case, run_dir, max(200, case.steps_per_round * 2))
        results[case.name] = (b, added, added_cpu, background, inst)
        alerts[case.name] = paired.alerts
        print(
            f"{case.name:<22} {b * 1e6:>8.0f} {added * 1e6:>7.1f} [{lo * 1e6:>4.0f},{hi * 1e6:>4.0f}] "
            f"{added / b * 100:>7.2f}% {added_cpu * 1e6:>6.1f} [{clo * 1e6:>4.0f},{chi * 1e6:>4.0f}] "
            f"{floor * 1e6:>8.1f}/{floor_cpu * 1e6:<8.1f} {background * 1e6:>18.1f} "
            f"{inst['publish_p50_us']:>7.1f}/{inst['publish_p99_us']:<7.1f} {inst['measure_p50_us']:>8.1f}"
        )
    tiny = CASES[0]
    growth = rss_growth_per_100k(tiny, max(2000, int(20_000 * scale)), run_dir)
    bg_alone = background_cost(tiny, 2000)
    rules_us = rules_cost(learning(3000))
    load_end = os.getloadavg()
    print(f"\nload average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end (1-minute, {os.cpu_count()} CPUs)")
    print(f"RSS growth with a Watch on the tiny MLP, extrapolated: {growth / 1e6:.2f} MB per 100k steps")
    print(f"Publisher thread per step record, timed alone (build, rules, encode, append): {bg_alone:.1f} µs")
    print(f"The fourteen rules per step record of a run that learns, timed alone: {rules_us:.2f} µs")
    for name, raised in alerts.items():  # a bench of a healthy run must not pay for an alert's episode
        print(f"Alerts the watched {name} raised: {', '.join(raised) if raised else 'none'}")
    _, added, added_cpu, background, inst = results[tiny.name]
    print("\nTargets (issue 18):")
    checks = [
        ("tiny MLP: added wall ≤ 55 µs a step", added * 1e6 <= 55),
        ("tiny MLP: training-thread CPU ≤ 40 µs a step", added_cpu * 1e6 <= 40),
        ("tiny MLP: publisher thread ≤ 10 µs a record", background * 1e6 <= 10),
        ("the rules ≤ 5 µs a step record (a run that learns, timed alone)", rules_us <= 5),
        ("publishing p50 ≤ 5 µs", inst["publish_p50_us"] <= 5),
        ("publishing p99 ≤ 20 µs", inst["publish_p99_us"] <= 20),
        ("< 1 MB RSS growth per 100k steps", growth < 1e6),
    ]
    bars = {CASES[1].name: 0.02, CASES[2].name: 0.01}
    for name, bar in bars.items():
        b, added, _, _, _ = results[name]
        size = "≥ 10 ms" if b >= 0.010 else f"{b * 1e3:.1f} ms, under the 10 ms the bar is for"
        checks.append((f"≤ {bar:.0%} added on {name} (bare step {size})", added / b <= bar))
    for text, ok in checks:
        print(f"  {'met    ' if ok else 'NOT MET'}  {text}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="tuiwatch-bench-") as scratch:
        tempfile.tempdir = scratch  # every run directory of this bench (38 MB a run) is removed at its end
        main()
