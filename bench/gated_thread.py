"""A lead of issue 18, measured: the publisher thread's work only while the training thread is in its backward.

On the tiny MLP the publisher thread's Python lands on the step's wall time
almost one for one: whenever it holds the GIL, the training thread waits at
the end of its next torch op. A backward releases the GIL for its whole run,
so a thread that did its work only then would overlap the training thread
instead of stopping it. Four arms, rotating, on the tiny MLP (2-32-2, batch
64, one torch thread), each with the same stand-in for the publisher's work
a record (a step record of a run that learns, fed to the fourteen rules and
encoded):

- bare: the loop alone;
- timer: the thread wakes every 100 ms and takes every record waiting (the
  pipeline's shape);
- gated: the loop sets an event before ``loss.backward()`` and clears it
  after; the thread works only while it is set, one record at a time;
- yielding: the timer's thread, which lets the GIL go after each record
  (``time.sleep(0)``), so that the training thread waits for one record's
  work at most, not for a whole batch of them (2026-12-07, fourteenth
  session).

Prints the added wall and training-thread CPU a step (median over rounds of
arm - bare in the same round) and the load average at start and end:

    python bench/gated_thread.py [--rounds 7] [--steps 3000]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import threading
import time
from typing import Any

import overhead  # (bench/: this directory is on sys.path when run as a script)
import torch
from torch import nn

from tuiwatch.ledger.codec import encode
from tuiwatch.rules import Diagnosis


class Work:
    """What the publisher thread does a record, without the Watch: the rules and the encoding of a step record."""

    def __init__(self, records: list[dict[str, Any]]):
        self.records = records
        self.feed = Diagnosis().feed
        self.lines: list[bytes] = []

    def __call__(self, i: int) -> None:
        record = dict(self.records[i])
        record["t"] = time.time()
        self.feed(record)
        self.lines.append(encode(record))


class Timer:
    def __init__(self, work: Work):
        self.work, self.queue, self.stopping = work, collections.deque[int](), False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopping:
            time.sleep(0.1)
            while self.queue:
                self.work(self.queue.popleft())

    def before_backward(self) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def close(self) -> None:
        self.stopping = True
        self.thread.join()


class Gated(Timer):
    def __init__(self, work: Work):
        self.go, self.idle = threading.Event(), threading.Event()
        super().__init__(work)

    def run(self) -> None:
        while not self.stopping:
            self.go.wait(0.1)
            while self.go.is_set() and self.queue:
                self.work(self.queue.popleft())
            self.idle.wait(0.1)

    def before_backward(self) -> None:
        if self.queue:
            self.idle.clear()
            self.go.set()

    def after_backward(self) -> None:
        if self.go.is_set():
            self.go.clear()
            self.idle.set()

    def close(self) -> None:
        self.stopping = True
        self.go.set()
        self.idle.set()
        self.thread.join()


class Yielding(Timer):
    def run(self) -> None:
        while not self.stopping:
            time.sleep(0.1)
            while self.queue:
                self.work(self.queue.popleft())
                time.sleep(0)  # the GIL to whoever waits for it


def arm(
    kind: str, batches: list[tuple[torch.Tensor, torch.Tensor]], records: list[dict[str, Any]]
) -> tuple[float, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    publisher = {"bare": None, "timer": Timer, "gated": Gated, "yielding": Yielding}[kind]
    thread = publisher(Work(records)) if publisher is not None else None
    wall, cpu = time.perf_counter(), time.thread_time()
    for i, (xb, yb) in enumerate(batches):
        loss = nn.functional.cross_entropy(model(xb), yb)
        if thread is not None:
            thread.before_backward()
        loss.backward()
        if thread is not None:
            thread.after_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if thread is not None:
            thread.queue.append(i)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    if thread is not None:
        thread.close()
    return wall / len(batches) * 1e6, cpu / len(batches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64 * args.steps, 2, generator=g)
    y = (x[:, 0] > 0).long()
    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, len(x), 64)]
    records = overhead.learning(args.steps)
    work = Work(records)
    t0 = time.thread_time()
    for i in range(len(records)):
        work(i)
    alone = (time.thread_time() - t0) / len(records) * 1e6
    print(f"load average at start {os.getloadavg()[0]:.2f}; the work a record timed alone {alone:.1f} µs")
    kinds = ["bare", "timer", "gated", "yielding"]
    arm("bare", batches, records)  # warm up
    added: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds[1:]}
    bare_walls = []
    for r in range(args.rounds):
        shift = r % len(kinds)
        got = {k: arm(k, batches, records) for k in kinds[shift:] + kinds[:shift]}
        bare_walls.append(got["bare"][0])
        for k in added:
            added[k].append((got[k][0] - got["bare"][0], got[k][1] - got["bare"][1]))
    print(f"bare step {statistics.median(bare_walls):.0f} µs, {args.rounds} rotating rounds of {args.steps} steps")
    for k, pairs in added.items():
        wall = statistics.median(p[0] for p in pairs)
        cpu = statistics.median(p[1] for p in pairs)
        print(f"{k:6} added wall {wall:7.1f} µs a step, training-thread CPU {cpu:7.1f} µs")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
