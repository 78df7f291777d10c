"""Ledger writers killed mid-write, for tests/publisher/test_hardening.py.

    python tests/scripts/killed_writers.py DIR --torn 20 --rounds 1000 --seed 0

Forks a writer (a FileLedger appending batches of records, as the publisher does), kills it with SIGKILL at a
random moment after its first write, and starts again with a new ledger in DIR, until ``--torn`` kills landed inside
a write (the ledger's last line cut short) or ``--rounds`` rounds ran. Prints one JSON line: the rounds and the torn
ledgers. The test reads every ledger itself.

A script of its own because the forks must come from a small process. A fork and its exit cost in proportion to
what the parent holds: the test forked the pytest process itself, which grows over a suite run, and took 45 s one
test after another (104 s under Python 3.10 with CUDA torch) against 0.7 s alone; a process with torch and 1.5 GB
touched took ~90 ms a round, one with torch only ~14 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import time
from pathlib import Path

from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.reader import read_ledger
from tuiwatch.ledger.writer import FileLedger


def write_until_killed(path: Path, first_written: int) -> None:
    """The child: batches of records, as the publisher appends them; a byte on ``first_written`` after the first."""
    store = FileLedger(path)
    step = 0
    while True:
        store.append(b"".join(encode({"kind": "step", "step": step + i, "pad": "x" * 3000}) for i in range(7)))
        step += 7
        if first_written >= 0:
            os.write(first_written, b"w")
            os.close(first_written)
            first_written = -1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--torn", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)  # noqa: S311 - the moments of the kills, not secrets
    torn = rounds = 0
    while torn < args.torn and rounds < args.rounds:
        path = args.dir / f"ledger-{rounds}.jsonl"
        rounds += 1
        told, tell = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns
            try:
                os.close(told)
                write_until_killed(path, tell)
            finally:
                os._exit(1)
        os.close(tell)
        ready, _, _ = select.select([told], [], [], 60)
        os.close(told)
        if not ready:
            raise SystemExit(f"the writer of {path} wrote nothing in 60 s")
        time.sleep(rng.uniform(0.0, 0.004))  # the moment of the kill, at random, while it writes
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reader = read_ledger(path)
        for _ in reader:
            pass
        torn += reader.skipped
    print(json.dumps({"rounds": rounds, "torn": torn}))


if __name__ == "__main__":
    main()
