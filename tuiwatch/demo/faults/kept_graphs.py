"""Losses kept in a list with their graphs.

``losses.append(loss)`` instead of ``loss.item()``, with
``backward(retain_graph=True)`` (added once to silence "Trying to backward
through the graph a second time"), keeps every step's activations alive: the
process grows by about 0.25 MB a step. Expected: ``memory-growth`` on the
RSS series once the last half of the run holds 16 samples over at least 200
steps. The rule counts samples and the run's length in steps, and the
sampler takes them by time: sampled every 0.1 s here that is ~3 s (~450
steps on a 2-core CPU). At 0.25 s it was ~9 s, step ~1,300 of the matrix's
1,500, and a machine with faster steps would reach the end of the run first.
"""

from __future__ import annotations

from typing import Any

import torch

from tuiwatch.demo.loop import Outcome, train
from tuiwatch.demo.problems import loader, mlp, seeded_problem

RULE = "memory-growth"
STARTS = 0
STEPS = 1500  # the rule matrix's run length for this fault (docs/rules.md)


def keep_the_graph(outcome: Outcome, loss: torch.Tensor) -> bool:
    outcome.kept.append(loss)  # the bug: each loss keeps its whole graph alive...
    return True  # ...and backward(retain_graph=True) keeps its tensors


def run(steps: int = 3000, seed: int = 0, run_dir: str | None = "runs", **kw: Any) -> Outcome:
    g, x, y = seeded_problem(seed, 8192)
    model = mlp(width=128)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    kw.setdefault("system", 0.1)
    kw.setdefault("delay_s", 0.005)
    return train(
        model,
        optimizer,
        loader(x, y, g, batch_size=256),
        name="fault-kept-graphs",
        steps=steps,
        run_dir=run_dir,
        seed=seed,
        on_loss=keep_the_graph,
        **kw,
    )


if __name__ == "__main__":
    run()
