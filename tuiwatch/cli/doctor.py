"""``tuiwatch doctor``: what works on this host, and the fix for what does not. Never imports torch itself."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tuiwatch.analysis.format import size
from tuiwatch.ledger.litter import sweep_stale_temps

# Run in a child interpreter: torch stays out of this process, and a broken CUDA setup cannot hang it.
TORCH_PROBE = (
    "import torch; c = torch.cuda.is_available(); "
    "print(torch.__version__, torch.version.cuda, c, torch.cuda.device_count() if c else 0)"
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check what tuiwatch can do on this host",
        description="Check torch and CUDA, NVML and the driver, the socket directory and the run directory; "
        "print a fix for each failure. Exit 1 when something that a run needs is broken.",
    )
    p.add_argument("--run-dir", default="runs", help="the run directory to check (default ./runs)")
    p.set_defaults(run=run)


def _torch() -> tuple[str, str, str]:
    try:
        out = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "warn", "torch: importing it took over 60 s", "check the CUDA driver (nvidia-smi)"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return "warn", f"torch: not importable here ({last})", "install torch in the training environment"
    version, cuda, available, count = out.stdout.split()
    if available == "True":
        return "ok", f"torch {version}, CUDA {cuda}, {count} GPU(s) visible", ""
    detail = "CPU build" if cuda == "None" else f"CUDA {cuda} build, but no GPU is usable"
    fix = "" if cuda == "None" else "check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi)"
    return "ok" if cuda == "None" else "warn", f"torch {version}: {detail}", fix


def _nvml() -> tuple[str, str, str]:
    from tuiwatch.publisher.background import nvml

    gpus, error = nvml.sample_gpus()
    if error is not None:
        return (
            "warn",
            f"NVML: {error}",
            "GPU utilisation and temperature need an NVIDIA driver (nvidia-ml-py talks to it)",
        )
    driver = nvml.driver_version()
    return "ok", f"NVML: driver {driver}, {len(gpus or [])} GPU(s)", ""


def _socket_dir() -> tuple[str, str, str]:
    from tuiwatch.errors import TuiwatchError
    from tuiwatch.wire.socketdir import ensure_socket_dir, socket_dir

    path = socket_dir()
    try:
        ensure_socket_dir(path)
    except TuiwatchError as exc:
        return "fail", f"socket directory: {exc}", "set TUIWATCH_DIR to a directory only you can write"
    mode = os.stat(path).st_mode & 0o777
    return "ok", f"socket directory {path} (mode {mode:o}, yours)", ""


def _run_dir(run_dir: str) -> tuple[str, str, str]:
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return "fail", f"run directory {path}: cannot write ({exc.strerror})", "give Watch(run_dir=...) a writable one"
    removed, freed = sweep_stale_temps(path)
    swept = (
        f"; removed {removed} half-written checkpoint/dump file(s) of killed runs ({size(freed)})" if removed else ""
    )
    free = os.statvfs(path)
    gib = free.f_bavail * free.f_frsize / 2**30
    if gib < 1:
        return "warn", f"run directory {path}: writable, {gib:.2f} GiB free{swept}", "checkpoints need room: free some"
    return "ok", f"run directory {path}: writable, {gib:.1f} GiB free{swept}", ""


def run(args: argparse.Namespace) -> int:
    checks = [_torch(), _nvml(), _socket_dir(), _run_dir(args.run_dir)]
    for status, what, fix in checks:
        print(f"{status:<4}  {what}" + (f"\n      fix: {fix}" if fix else ""))
    return 1 if any(status == "fail" for status, _, _ in checks) else 0
