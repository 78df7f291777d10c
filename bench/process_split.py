"""What the publisher's work in a process of its own would save the tiny MLP: a prototype, measured side by side.

    python bench/process_split.py [--rounds 9] [--steps 3000]

Issue 18's structural lead: the publisher thread's ~17 µs of Python a step record (build, fourteen rules,
encode, append) lands on a small model's step almost one for one through the GIL. Four arms in one process,
rotating their order round by round, on ``overhead.py``'s tiny MLP (the same model copy, the same batches):

- bare: the loop without a Watch;
- watched: a default Watch (records handed to its publisher thread);
- dropped: the same Watch with its records dropped at the hand-over: no publisher work at all, the bound below
  which no way of handing records over can go;
- piped: the prototype. The training thread builds and encodes each record itself and writes them, 64 at a time,
  into a pipe to a child process that decodes them, runs the fourteen rules and appends the lines to a file.

Printed: each arm's added wall and training-thread CPU a step over bare (median of the paired differences, with
the interquartile range), the publisher thread's CPU a step (watched), the child's (piped, from its schedstat),
and the load average at start and end. Only the hand-over is prototyped: the viewers' socket, dumps and commands,
which stay in the training process in any such design, are not.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from overhead import Arm, print_added, rotating_rounds, tiny_bench
from torch.utils.data import DataLoader

from tuiwatch.ledger.codec import encode

LINES_A_WRITE = 64
CHILD = """
import sys, orjson
from tuiwatch.rules import Diagnosis
diagnosis = Diagnosis()
with open(sys.argv[1], "wb") as ledger:
    for line in sys.stdin.buffer:
        ledger.write(line)
        for alert in diagnosis.feed(orjson.loads(line)):
            ledger.write(orjson.dumps(alert) + b"\\n")
"""


class Piped:
    """The prototype's hand-over: build and encode here, write to the child in batches."""

    def __init__(self, ledger: Path):
        self.child = subprocess.Popen([sys.executable, "-c", CHILD, str(ledger)], stdin=subprocess.PIPE)
        assert self.child.stdin is not None
        self.fd = self.child.stdin.fileno()
        self.lines: list[bytes] = []
        self.encoding: list[float] = []  # training-thread CPU seconds of each record's build and encode
        self.writing: list[float] = []  # ... and of each write, per record

    def put(self, item: Any) -> None:
        t0 = time.thread_time()
        self.lines.append(encode(item if isinstance(item, dict) else item.build()))
        self.encoding.append(time.thread_time() - t0)
        if len(self.lines) >= LINES_A_WRITE:
            self.flush()

    def flush(self) -> None:
        t0, n = time.thread_time(), len(self.lines)
        os.write(self.fd, b"".join(self.lines))
        self.lines.clear()
        if n:
            self.writing.append((time.thread_time() - t0) / n)

    def cpu_s(self) -> float:
        with open(f"/proc/{self.child.pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def close(self) -> None:
        self.flush()
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(30)


class PipedArm(Arm):
    """The piped arm: also the child process's CPU seconds a step of each run, every record of it written."""

    piped: Piped
    child: list[float]

    def run(self, loader: DataLoader[Any], steps: int) -> tuple[float, float]:
        before = self.piped.cpu_s()
        result = super().run(loader, steps)
        self.piped.flush()
        self.child = [*getattr(self, "child", []), (self.piped.cpu_s() - before) / steps]
        return result


def main() -> None:
    b = tiny_bench(__doc__ or "", rounds=9)
    case, run_dir, model = b.case, b.run_dir, b.model
    piped = Piped(run_dir / "piped.jsonl")
    arms: dict[str, Arm] = {}
    for kind in ARMS:
        make = PipedArm if kind == "piped" else Arm
        arms[kind] = make(case, "bare" if kind == "bare" else "watched", run_dir, model)
        if kind == "dropped":
            arms[kind].watch._pipeline.put = lambda item: None  # type: ignore[union-attr,method-assign]
        elif kind == "piped":
            arms[kind].watch._pipeline.put = piped.put  # type: ignore[union-attr,method-assign]
            arms[kind].piped = piped  # type: ignore[attr-defined]
    wall, cpu = rotating_rounds(arms, b.loader, b.rounds, b.steps)
    child = arms["piped"].child[1:]  # type: ignore[attr-defined]  # the warm-up run left out
    for arm in arms.values():
        if arm.watch is not None:
            arm.watch.close()
    piped.close()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print_added(wall, cpu)
    background = arms["watched"].background[1:]  # the warm-up run left out
    print(f"watched: publisher thread {statistics.median(background) * 1e6:.1f} µs of CPU a step")
    print(
        f"piped: a record's build and encode {statistics.median(piped.encoding) * 1e6:.1f} µs of training-thread CPU"
        f" (p90 {sorted(piped.encoding)[len(piped.encoding) * 9 // 10] * 1e6:.1f}), its share of a write"
        f" {statistics.median(piped.writing) * 1e6:.2f} µs"
    )
    print(f"piped: child process {statistics.median(child) * 1e6:.1f} µs of CPU a step")
    lines = (run_dir / "piped.jsonl").read_bytes().count(b"\n")
    print(f"piped: {lines} lines in the child's ledger")


ARMS = ("bare", "watched", "dropped", "piped")

if __name__ == "__main__":
    main()
