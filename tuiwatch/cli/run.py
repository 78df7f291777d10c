"""``tuiwatch run script.py [args]``: run a training script that nobody edited, watched.

Like ``python script.py args`` (or ``python -m module args``): the same
``sys.argv``, output and exit status. The hooks it installs are described in
``tuiwatch/integrations/script.py`` and docs/integrations.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tuiwatch.errors import TuiwatchError
from tuiwatch.rules import build_rules

ON_NONFINITE = ("stop", "skip", "warn")  # spelled here so that `run --help` imports no torch


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run an unmodified training script with a Watch attached",
        usage="tuiwatch run [-h] [--name NAME] [--run-dir DIR] [--on-nonfinite {stop,skip,warn}] [--rules JSON]\n"
        "                    (SCRIPT [ARGS ...] | -m MODULE [ARGS ...])",
        description="Run a training script as python would (same argv, output and exit status), with a Watch "
        "found from its first optimizer step: grad norm, lr, data wait, batches, loss, the rules and the "
        "viewer's keys. Under torchrun: torchrun ... -m tuiwatch run train.py. tuiwatch's own options go "
        "before the script.",
    )
    p.add_argument("--name", help="the run's name (default: the script's)")
    p.add_argument("--run-dir", default="runs", help="where the run directory goes (default ./runs)")
    p.add_argument(
        "--on-nonfinite",
        choices=ON_NONFINITE,
        default="stop",
        help="a NaN/Inf gradient: stop before the update (default), skip the update, or only warn",
    )
    p.add_argument(
        "--rules",
        metavar="JSON",
        help="the rules, as Watch(rules=...) takes them: a list of ids, or {id: {threshold: value} or false}, "
        """e.g. '{"loss-spike": false}' (docs/rules.md)""",
    )
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, help="MODULE [ARGS ...]: run a module, as python -m")
    p.add_argument("script", nargs=argparse.REMAINDER, help="the script and its arguments")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.module is not None:
        if not args.module:
            raise TuiwatchError("run -m needs a module name: tuiwatch run -m package.train [args]")
        target, rest, module = args.module[0], args.module[1:], True
    elif args.script:
        target, rest, module = args.script[0], args.script[1:], False
        if not Path(target).is_file():
            raise TuiwatchError(f"run: no script at {target!r}: tuiwatch run path/to/train.py [args]")
    else:
        raise TuiwatchError("run needs a script: tuiwatch run train.py [args] (or -m module)")
    rules = _rules(args.rules)
    try:
        from tuiwatch.integrations.script import run_script
    except ImportError as exc:
        raise TuiwatchError(f"run needs torch ({exc.name} is missing): pip install torch") from None
    name = args.name or (target.rsplit(".", 1)[-1] if module else Path(target).stem)
    return run_script(
        target,
        rest,
        module=module,
        report=lambda line: print(line, file=sys.stderr),
        name=name,
        run_dir=args.run_dir,
        on_nonfinite=args.on_nonfinite,
        **({} if rules is None else {"rules": rules}),
    )


def _rules(text: str | None) -> Any:
    """``--rules``: checked before the script starts, not at its first optimizer step."""
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TuiwatchError(
            f"run --rules takes JSON (a list of rule ids, or {{id: {{threshold: value}} or false}}), e.g. "
            f"""'{{"loss-spike": false}}': {exc.msg} at character {exc.pos} of {text!r}"""
        ) from None
    try:
        build_rules(config)
    except (TypeError, ValueError) as exc:
        raise TuiwatchError(f"run --rules: {exc}") from None
    return config
