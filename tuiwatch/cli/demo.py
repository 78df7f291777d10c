"""``tuiwatch demo``: a synthetic training with a Watch attached, shown in the viewer.

The training runs in a child process (``demo --no-viewer``), exactly as a
user's script would, and the viewer attaches to its socket. Quitting the
viewer stops the demo run; with ``--no-viewer`` (or when stdout is not a
terminal) it only trains and prints a status line every few seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuiwatch.cli.attach import add_fps_option, viewer_options
from tuiwatch.errors import TuiwatchError

# The scenario names, spelled here so that `demo --help` imports no torch (tuiwatch.demo.faults.FAULTS).
FAULT_NAMES = (
    "nan-input",
    "log-zero",
    "big-lr",
    "numpy-graph",
    "optimizer-copy",
    "lr-collapse",
    "shuffled-labels",
    "slow-loader",
    "kept-graphs",
    "long-sequence",
    "overfit",
    "eval-train-mode",
    "corrupt-batch",
)


# The demo's training is the demo's own: quitting the demo ends it (on a run you attach to, q never does).
DEMO_QUIT = "quit the demo: its training ends too (q never stops a run you attach to)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run a small synthetic training with tuiwatch attached",
        description="Train a small model on synthetic data with a Watch attached, on the CPU, and open the "
        "viewer on it. Needs torch (pip install 'tuiwatch[demo]').",
    )
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the 2-32-2 MLP (default) or a small CNN")
    p.add_argument("--steps", type=_positive_int, default=3000, help="training steps (default 3000)")
    p.add_argument(
        "--delay", type=float, default=0.01, metavar="SECONDS", help="pause per step so it can be watched (0.01)"
    )
    p.add_argument(
        "--fault",
        choices=FAULT_NAMES,
        metavar="FAULT",
        help="plant one bug that a rule should name: " + ", ".join(FAULT_NAMES),
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default="runs", help="where the run directory goes (default ./runs)")
    p.add_argument("--no-viewer", action="store_true", help="only train and publish; print status lines")
    add_fps_option(p)
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.no_viewer or not sys.stdout.isatty():
        return _train(args)
    return _train_and_view(args)


def _train(args: argparse.Namespace) -> int:
    try:
        from tuiwatch.demo.training import run_demo
    except ImportError as exc:
        raise TuiwatchError(f"the demo needs torch ({exc.name} is missing): pip install 'tuiwatch[demo]'") from None
    if args.fault:
        return _train_with_fault(args)
    run_demo(args.model, steps=args.steps, delay_s=max(0.0, args.delay), seed=args.seed, run_dir=args.run_dir)
    return 0


def _train_with_fault(args: argparse.Namespace) -> int:
    from tuiwatch.demo.faults import scenario
    from tuiwatch.ledger.reader import read_ledger

    fault = scenario(args.fault)
    print(f"tuiwatch demo: fault {args.fault} ({(fault.__doc__ or '').strip().splitlines()[0]}); expect {fault.RULE}")
    outcome = fault.run(steps=args.steps, seed=args.seed, run_dir=args.run_dir, delay_s=max(0.0, args.delay))
    ledger = outcome.watch.ledger_path
    alerts = [r for r in read_ledger(ledger) if r.get("kind") == "alert"] if ledger else []
    for a in alerts:
        if a.get("severity") != "info":
            print(f"  step {a.get('step')}: {a.get('rule')} — {a.get('message')}")
    if outcome.error is not None:
        print(f"  raised {type(outcome.error).__name__}: {str(outcome.error).splitlines()[0][:300]}")
    dump = getattr(outcome.error, "dump", None)
    if dump:
        from tuiwatch.microscope.first_nonfinite import first_nonfinite_module
        from tuiwatch.publisher.dumps import Dump, load_dump

        loaded = load_dump(dump)
        assert isinstance(loaded, Dump)  # a directory: a dump, not a checkpoint
        site = first_nonfinite_module(outcome.watch.model, loaded.batch)
        print(f"  first_nonfinite_module(model, load_dump(dump).batch): {site}")
    ended = f"it raised {type(outcome.error).__name__}" if outcome.error else "it finished"
    print(f"tuiwatch demo: {outcome.steps} steps, {ended}; ledger {ledger or '(memory only)'}")
    return 0


def _train_and_view(args: argparse.Namespace) -> int:
    from tuiwatch.viewer.app import TuiwatchApp
    from tuiwatch.viewer.sources import SocketSource
    from tuiwatch.wire.socketdir import check_private_dir, list_sockets, socket_dir

    argv = [sys.executable, "-m", "tuiwatch", "demo", "--no-viewer", "--model", args.model]
    argv += ["--steps", str(args.steps), "--delay", str(args.delay), "--seed", str(args.seed)]
    argv += ["--run-dir", args.run_dir] + (["--fault", args.fault] if args.fault else [])
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 60
            path: Path | None = None
            while path is None:
                if child.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    last = err.read().decode(errors="replace").strip().splitlines()
                    raise TuiwatchError(f"the demo training did not start: {last[-1] if last else 'no output'}")
                path = next((e.path for e in list_sockets(check_private_dir(socket_dir())) if e.pid == child.pid), None)
                time.sleep(0.05)  # waiting for another process to create its socket
            viewer = viewer_options(args)
            code = TuiwatchApp(SocketSource(path, None), quit_does=DEMO_QUIT, **viewer).run_viewer()
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGINT)  # the demo ends its ledger with reason "stopped"
                try:
                    child.wait(5)
                except subprocess.TimeoutExpired:
                    child.kill()
    print(
        f"tuiwatch demo: q ended the demo's training; its ledger is under {args.run_dir}/ "
        f"(tuiwatch replay {args.run_dir})"
    )
    return code
