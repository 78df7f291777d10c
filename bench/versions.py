"""Two versions of tuiwatch side by side: is the new one slower? Paired rounds, one run.

Each round runs the same two workloads once with each tree's ``tuiwatch``
(``PYTHONPATH=TREE``), in alternating order, each in a fresh process:

- ``publisher``: the tiny MLP (2-32-2, batch 64) for ``--steps`` steps with a
  default Watch, minus the same loop bare, in the same process; reported as
  added µs per step, wall and training-thread CPU;
- ``viewer``: replaying a ``--records``-step ledger in the headless viewer to
  its end: the source decoding, the fold, the views and the panes' drawing;
  reported as the process's CPU seconds and wall seconds.

The result is the median over rounds of new / old (per round, so drift and
the machine's load hit both alike), with the interquartile range, and the
load average beside it. A ratio under 1 means the new tree is faster::

    git worktree add /tmp/old <commit>
    python bench/versions.py /tmp/old .  [--rounds 7]

With ``--parts``, each round instead times the publisher's parts alone in
each tree (PARTS): publishing and measurement p50 on the training thread,
building a step record, the fourteen rules over a run that learns, and the
publisher thread's whole work a record; the median over rounds of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

BENCH = Path(__file__).resolve().parent  # this directory's helpers, for PARTS

PUBLISHER = """
import gc, sys, tempfile, time
import torch
from torch import nn
from learnable import teacher_labels
from tuiwatch import Watch
torch.set_num_threads(1)
steps = int(sys.argv[1])
g = torch.Generator().manual_seed(0)
x = torch.randn(64 * 50, 2, generator=g)
y = teacher_labels(x, 2, g)  # learnable (bench/learnable.py): a healthy run, no rule active on it
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, generator=g, shuffle=True)

def arm(watched):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    watch = Watch(model, opt, name="bench", run_dir=tempfile.mkdtemp()) if watched else None
    n = 0
    gc.collect()
    cpu, wall = time.thread_time(), time.perf_counter()
    while n < steps:
        for xb, yb in (watch.batches(loader) if watch else loader):
            loss = nn.functional.cross_entropy(model(xb), yb)
            if watch:
                watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            n += 1
            if n >= steps:
                break
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    if watch:
        watch.close()
    return wall / steps, cpu / steps

arm(True)  # warm up: imports, allocator, the first Watch
bare_wall, bare_cpu = arm(False)
wall, cpu = arm(True)
print((wall - bare_wall) * 1e6, (cpu - bare_cpu) * 1e6)
"""

VIEWER = """
import resource, sys, time
from tuiwatch.viewer.app import TuiwatchApp
from tuiwatch.viewer.sources import FileSource
class Until(TuiwatchApp):
    def on_source_ended(self, message):
        super().on_source_ended(message)
        self.call_after_refresh(self.exit)
wall = time.perf_counter()
app = Until(FileSource(sys.argv[1]))
app.run(headless=True, size=(120, 36))
wall = time.perf_counter() - wall
usage = resource.getrusage(resource.RUSAGE_SELF)
assert app.state.status == "finished", app.state.status
print(wall, usage.ru_utime + usage.ru_stime)
"""


PARTS = """
import statistics, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import overhead
from publisher_changes import captured_steps
case = overhead.CASES[0]
timed = overhead.instrumented(case, Path(tempfile.mkdtemp()), 3000)
states = captured_steps(600)
builds = []
for _ in range(9):
    t0 = time.thread_time()
    for s in states:
        s.build()
    builds.append((time.thread_time() - t0) / len(states) * 1e6)
rules = overhead.rules_cost(overhead.learning(3000))
alone = overhead.background_cost(case, 3000)
print(timed["publish_p50_us"], timed["measure_p50_us"], statistics.median(builds), rules, alone)
"""
PART_NAMES = (
    "publishing p50 µs",
    "measurements p50 µs",
    "build µs a record",
    "rules µs a record",
    "publisher thread µs a record",
)


def ledger(path: Path, steps: int) -> Path:
    with open(path, "wb") as f:
        f.write(orjson.dumps({"kind": "run", "t": 0.0, "name": "bench", "host": "h", "device": "cpu"}) + b"\n")
        for s in range(steps):
            record = {
                "kind": "step",
                "t": 1.0 + s * 0.01,
                "step": s,
                "epoch": s // 1000,
                "loss": 1.0 / (1 + s),
                "lr": [0.1],
                "grad_norm": 1.0 + (s % 7),
                "data_wait_s": 0.001,
                "compute_s": 0.004,
                "examples_per_s": 12800.0,
            }
            f.write(orjson.dumps(record) + b"\n")
            if s % 1000 == 999:
                f.write(
                    orjson.dumps(
                        {
                            "kind": "system",
                            "t": 1.0 + s * 0.01,
                            "cpu_percent": 99.0,
                            "rss": 300 << 20,
                            "workers": 0,
                            "gpus": None,
                        }
                    )
                    + b"\n"
                )
        f.write(orjson.dumps({"kind": "end", "t": 1e6, "reason": "finished"}) + b"\n")
    return path


def run(tree: Path, script: str, *args: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree.resolve()), str(BENCH)))}
    # Run in the tree: `python -c` puts the working directory first on sys.path, so from the repository's root
    # both arms imported the working copy's tuiwatch, whatever PYTHONPATH said (fixed in issue 18's last session).
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        cwd=tree.resolve(),
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return [float(v) for v in out.stdout.split()]


def summary(ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return f"x{statistics.median(ratios):.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path, help="the tree of the version to compare against")
    p.add_argument("new", type=Path, help="the tree of the version under test")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3000, help="training steps per publisher run")
    p.add_argument("--records", type=int, default=100_000, help="steps in the replayed ledger")
    p.add_argument("--parts", action="store_true", help="the publisher's parts, each timed alone (PARTS), instead")
    args = p.parse_args()
    if args.parts:
        parts(args.old, args.new, args.rounds)
        return
    path = ledger(Path(tempfile.mkdtemp()) / "ledger.jsonl", args.records)
    names = ("publisher added wall", "publisher added CPU", "viewer replay wall", "viewer replay CPU")
    ratios: dict[str, list[float]] = {n: [] for n in names}
    load = []
    for r in range(args.rounds):
        order = [args.old, args.new] if r % 2 == 0 else [args.new, args.old]
        got = {tree: run(tree, PUBLISHER, str(args.steps)) + run(tree, VIEWER, str(path)) for tree in order}
        for name, old, new in zip(names, got[args.old], got[args.new], strict=True):
            ratios[name].append(new / old)
        load.append(os.getloadavg()[0])
        pairs = zip(names, got[args.old], got[args.new], strict=True)
        print(f"round {r + 1}: " + "  ".join(f"{n} {o:.1f}->{v:.1f}" for n, o, v in pairs), flush=True)
    print(
        f"\nnew / old, median over {args.rounds} paired rounds [interquartile range]; "
        f"load average {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores"
    )
    for name in names:
        print(f"  {name:<22} {summary(ratios[name])}")
    print(f"  (publisher: µs per step over the bare loop; viewer: seconds to replay {args.records:,} steps)")


def parts(old: Path, new: Path, rounds: int) -> None:
    """The publisher's parts in each tree, alternating: absolute µs (each timed alone), and new / old."""
    values: dict[Path, list[list[float]]] = {old: [], new: []}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        for tree in [old, new] if r % 2 == 0 else [new, old]:
            values[tree].append(run(tree, PARTS))
        load.append(os.getloadavg()[0])
    print(f"median over {rounds} rounds, the trees alternating; load average {min(load):.1f}-{max(load):.1f}")
    print("| part | old | new | new / old |\n|---|---|---|---|")
    for i, name in enumerate(PART_NAMES):
        was = statistics.median(v[i] for v in values[old])
        now = statistics.median(v[i] for v in values[new])
        ratio = summary([n[i] / o[i] for o, n in zip(values[old], values[new], strict=True)])
        print(f"| {name} | {was:.2f} | {now:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
