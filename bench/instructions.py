"""What a Watch costs a step, counted in machine instructions: the same on a loaded machine as on an idle one.

Wall and CPU times on this shared 2-core machine spread by tens of µs from
round to round (docs/performance.md), more than most single changes to the
hot path save. valgrind's callgrind counts the instructions a program runs,
whatever else the machine is doing: the same program, inputs and environment
give the same count to a few parts in ten thousand. Instructions are not
time (a cache miss costs more than an add), but a change that runs fewer of
them on the training thread is one that costs it less, and the count tells
that apart where the clock cannot.

Each arm runs in a process of its own under callgrind, on the tiny MLP of
``bench/overhead.py`` (its DataLoader, its batches, one torch thread), with
instrumentation off through the imports and a warm-up, then on for the
measured steps, which are counted inside one call of ``functools.reduce``
(``--toggle-collect``), so that only the training thread's work in those
steps is counted:

- bare: the loop alone;
- floor: the Watch's per-step fields measured by hand (``overhead.floor_loop``);
- watched: a default Watch (``watch.batches()``, ``watch.log(loss=...)``),
  its publisher thread held still while the steps are counted (that
  thread's work is the next arm's, and beside the counted one it moved the
  count by ±12,000 a step);
- publisher: the publisher thread's work for the watched arm's step records
  (build, rules, encoding, the ledger's append), run on the main thread from
  records captured at the hand-over (``overhead.background_cost``'s way).

Prints instructions a step (a record, for the publisher), and what the
floor and the Watch add over the bare loop. ``--tree DIR`` imports tuiwatch
from another checkout (``git archive REV | tar -x -C DIR``), to count two
versions of the code side by side:

    python bench/instructions.py [--steps 200] [--tree DIR] [--arms bare,floor,watched,publisher]

Needs valgrind (Debian's package); about 40 s an arm, two at a time.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ARMS = ("bare", "floor", "watched", "publisher")


def count(arm: str, steps: int, tree: Path | None, work: Path) -> int:
    """Instructions the main thread ran in ``steps`` measured steps of ``arm``, under callgrind."""
    flag = work / arm
    out = work / f"{arm}.callgrind"
    # The arm's run directory goes into work, removed with it; so do valgrind's pipes, which callgrind_control
    # finds by the same TMPDIR.
    env = dict(os.environ, PYTHONHASHSEED="0", TMPDIR=str(work))
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        "--separate-threads=yes",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        arm,
        "--steps",
        str(steps),
        "--flag",
        str(flag),
    ]
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = flag.with_suffix(".ready")
    while not ready.exists():
        if child.poll() is not None:
            raise SystemExit(f"the {arm} arm ended before its measured steps: {child.stderr.read()[-2000:]}")
        time.sleep(0.1)
    # Instrumentation is switched on from outside; the child goes on once that is done.
    subprocess.run(["callgrind_control", "-i", "on", ready.read_text()], env=env, check=True, capture_output=True)
    flag.with_suffix(".go").touch()
    _, err = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"the {arm} arm failed: {err[-2000:]}")
    main_thread = Path(f"{out}-01").read_text(errors="replace")
    found = re.search(r"^totals: (\d+)", main_thread, re.MULTILINE)
    if found is None or not int(found.group(1)):
        raise SystemExit(f"the {arm} arm counted nothing ({out}-01): callgrind_control did not reach it")
    return int(found.group(1))


def child(arm: str, steps: int, flag: Path) -> None:
    """One arm, in the process callgrind runs: warm up, wait to be instrumented, run the measured steps."""
    sys.path.insert(0, str(BENCH))
    import torch
    from overhead import CASES, Arm, cycle, floor_loop, loader_for

    torch.set_num_threads(1)
    case = CASES[0]
    torch.manual_seed(0)
    kind = "watched" if arm == "publisher" else arm
    bench = Arm(case, kind, Path(tempfile.mkdtemp()), case.make_model())
    loader = loader_for(case, 50)
    bench.run(loader, 300)  # warm-up, uninstrumented
    model, opt, loss_fn, watch = bench.model, bench.opt, bench.loss_fn, bench.watch

    def bare() -> None:
        for x, y in cycle(loader, steps):
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def watched() -> None:
        assert watch is not None
        for x, y in watch.batches(cycle(loader, steps)):
            loss = loss_fn(model(x), y)
            watch.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def floor() -> None:
        floor_loop(model, opt, loss_fn, cycle(loader, steps), [])

    run: Any = {"bare": bare, "watched": watched, "floor": floor}.get(arm)
    if arm == "publisher":
        run = publisher_work(bench, loader, steps)
    flag.with_suffix(".ready").write_text(str(os.getpid()))
    while not flag.with_suffix(".go").exists():
        time.sleep(0.02)
    resume = park(watch._pipeline) if arm == "watched" else None
    run()  # instrumented, not counted: valgrind translates the code it meets for the first time
    if arm == "publisher":
        run = publisher_work(bench, loader, steps)
    functools.reduce(lambda _a, _b: run(), [0, 0])  # counted: --toggle-collect=functools_reduce
    if resume is not None:
        resume()
    if watch is not None:
        watch.close()


def park(pipeline: Any) -> Any:
    """Hold the publisher thread still until the returned function is called. Its work is counted apart (the
    publisher arm); running beside the training thread, it changed what the training thread ran from one run to
    the next (the GIL's hand-overs, the allocator's state, when the collector ran) by ±12,000 instructions a step."""
    parked, go = threading.Event(), threading.Event()

    def cycle() -> None:
        parked.set()
        go.wait()

    pipeline._cycle = cycle  # taken at the thread's next cycle, within its period
    if not parked.wait(10):
        raise SystemExit("the publisher thread did not stop for the count")

    def resume() -> None:
        del pipeline._cycle
        go.set()

    return resume


def publisher_work(bench: Any, loader: Any, steps: int) -> Any:
    """The publisher thread's work for ``steps`` step records of the watched arm, as a call on this thread."""
    from tuiwatch.ledger.writer import MemoryTail
    from tuiwatch.publisher.background.pipeline import Pipeline
    from tuiwatch.rules import Diagnosis

    watch = bench.watch
    captured: list[Any] = []
    watch._pipeline.put = captured.append
    bench.run(loader, steps)
    del watch._pipeline.put  # the class's put again
    pipeline = Pipeline(
        MemoryTail(max_bytes=64 << 20), capacity=len(captured) + 1, system_interval_s=None, diagnosis=Diagnosis()
    )
    for item in captured:
        pipeline.put(item)
    return functools.partial(pipeline._drain, final=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--tree", type=Path, help="a checkout whose tuiwatch to count (default: this one)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--flag", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.flag)
        return
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"--arms: unknown {', '.join(sorted(unknown))}; choose among {', '.join(ARMS)}")
    work = Path(tempfile.mkdtemp(prefix="tuiwatch-instructions-"))
    tree = args.tree.resolve() if args.tree else None
    print(f"tuiwatch from {tree or BENCH.parent}; tiny MLP 2-32-2, batch 64, {args.steps} counted steps an arm")
    # Two at a time (the machine's cores): a count does not depend on what else runs.
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            counts = dict(zip(arms, pool.map(lambda arm: count(arm, args.steps, tree, work), arms), strict=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # its callgrind files and run directories
    per_step = {arm: n / args.steps for arm, n in counts.items()}
    for arm, n in per_step.items():
        unit = "a record" if arm == "publisher" else "a step"
        over = "bare" in per_step and arm in ("floor", "watched")
        added = f", {n - per_step['bare']:+,.0f} over bare" if over else ""
        print(f"{arm:<10} {n:>12,.0f} instructions {unit}{added}")
    if {"bare", "floor", "watched"} <= set(per_step):
        floor = per_step["floor"] - per_step["bare"]
        print(f"the Watch's training thread adds {(per_step['watched'] - per_step['bare']) / floor:.2f}× the floor's")


if __name__ == "__main__":
    main()
