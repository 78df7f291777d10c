"""``tuiwatch demo``: a synthetic training with a Watch attached (the only command that imports torch)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run a small synthetic training with tuiwatch attached",
        description="Train a small model on synthetic data with a Watch attached, on the CPU. "
        "Needs torch (pip install 'tuiwatch[demo]').",
    )
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the 2-32-2 MLP (default) or a small CNN")
    p.add_argument("--steps", type=_positive_int, default=3000, help="training steps (default 3000)")
    p.add_argument(
        "--delay", type=float, default=0.01, metavar="SECONDS", help="pause per step so it can be watched (0.01)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default="runs", help="where the run directory goes (default ./runs)")
    p.add_argument("--no-viewer", action="store_true", help="only train and publish; print status lines")
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        from tuiwatch.demo.training import run_demo
    except ImportError as exc:
        from tuiwatch.errors import TuiwatchError

        raise TuiwatchError(f"the demo needs torch ({exc.name} is missing): pip install 'tuiwatch[demo]'") from None
    # The viewer does not exist yet: with or without --no-viewer the demo
    # trains and prints status lines; attach from another terminal.
    run_demo(args.model, steps=args.steps, delay_s=max(0.0, args.delay), seed=args.seed, run_dir=args.run_dir)
    return 0
