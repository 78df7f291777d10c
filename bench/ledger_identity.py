"""The ledgers of fixed seeded runs, with times, ids and paths taken out: for comparing two versions.

A change that should not change behaviour (a re-layout) must leave these
byte-identical. Run it once per version and compare the files::

    PYTHONPATH=OLD_TREE python bench/ledger_identity.py OUT_A   # the old tree's tuiwatch
    python bench/ledger_identity.py OUT_B                       # this one
    diff -r OUT_A OUT_B

Kept: every step, eval, alert, action and end record, field by field, in
order. Taken out: wall-clock fields (``t``, durations, rates), per-process
fields (pid, host, run id, paths, the socket) and the ``system`` and
``publisher`` records, which sample the machine rather than the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

# Fields that change from one run of the same seed to the next.
VOLATILE = {
    "t",
    "started",
    "run_id",
    "pid",
    "host",
    "argv",
    "run_dir",
    "socket",
    "socket_error",
    "tcp",
    "data_wait_s",
    "compute_s",
    "examples_per_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "seeding",
}
SAMPLED_KINDS = {"system", "publisher"}
TREE = str(Path(importlib.util.find_spec("tuiwatch").origin).parent.parent)  # type: ignore[union-attr,arg-type]
# (scenario, demo arguments): a healthy run of each model and faults whose rules dump or stop.
RUNS = [
    ("healthy-mlp", ["--model", "mlp", "--steps", "400"]),
    ("healthy-cnn", ["--model", "cnn", "--steps", "60"]),
    ("big-lr", ["--fault", "big-lr", "--steps", "200"]),
    ("nan-input", ["--fault", "nan-input", "--steps", "200"]),
    ("optimizer-copy", ["--fault", "optimizer-copy", "--steps", "200"]),
    ("eval-train-mode", ["--fault", "eval-train-mode", "--steps", "300"]),
]


def normalised(record: dict[str, Any]) -> dict[str, Any] | None:
    if record.get("kind") in SAMPLED_KINDS:
        return None
    out = {k: v for k, v in record.items() if k not in VOLATILE}
    evidence = out.get("evidence")
    if isinstance(evidence, dict) and "dump" in evidence:
        out["evidence"] = {**evidence, "dump": Path(evidence["dump"]).name}
    if out.get("kind") == "end":
        for key in ("dropped_viewers", "viewers", "refused_peers", "status", "error"):
            out.pop(key, None)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, demo_args in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            # The tuiwatch this script imports, from a directory that holds no other: `python -m` puts the working
            # directory first on sys.path, so run from a checkout it took that checkout's, whatever PYTHONPATH said.
            env = {**os.environ, "TUIWATCH_DIR": tmp, "PYTHONPATH": TREE}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tuiwatch",
                    "demo",
                    "--no-viewer",
                    "--delay",
                    "0",
                    "--seed",
                    "3",
                    "--run-dir",
                    f"{tmp}/runs",
                    *demo_args,
                ],
                check=False,
                env=env,
                cwd=tmp,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=600,
            )
            ledgers = sorted(Path(tmp, "runs").glob("*/ledger.jsonl"))
            lines = []
            for ledger in ledgers:
                for line in ledger.read_bytes().splitlines():
                    record = normalised(orjson.loads(line))
                    if record is not None:
                        lines.append(orjson.dumps(record))  # in the file's own key order
            (args.out / f"{name}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
            print(f"{name}: {len(lines)} records from {len(ledgers)} ledger(s)")


if __name__ == "__main__":
    main()
