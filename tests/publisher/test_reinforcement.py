"""A Q-network's run, as Lightning's DQN example trains one (examples/pytorch/domain_templates/reinforce_learn_Qnet.py).

Its batches are replay samples ``(states, actions, rewards, dones, next_states)`` with integer actions, one a row
of the Q-values ``(batch, actions)``: to ``class_count`` a classifier's logits and labels. Its loss is an MSE
against targets from a target network, which jumps when that network is synced. Run with the Watch on its
``LightningModule`` (whose ``training_step`` calls ``self.net``: watched by its parts), the example's 600 steps
on CartPole raised ``loss-chance`` at step 31, "went back to chance level ln(2)".
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuiwatch.ledger.records import Record
from tuiwatch.publisher.watch import Watch

from ..helpers import records


class DQNLightning(nn.Module):
    """The example's module without Lightning: a forward that training never calls, the net and its target."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
        self.target_net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> Any:
        return self.net(x)  # pragma: no cover - as in the example: training calls self.net


def _train(run_root: Path, **options: object) -> list[Record]:
    torch.manual_seed(0)
    model = DQNLightning()
    opt = torch.optim.Adam(model.net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g), torch.rand(16, generator=g))
        for _ in range(120)
    ]
    with Watch(model, opt, run_dir=run_root, system=False, quiet=True, **options) as watch:  # type: ignore[arg-type]
        for i, (states, actions, rewards) in enumerate(watch.batches(batches)):
            q = model.net(states).gather(1, actions.unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                # A target network synced at step 40 is a new regression target: the loss rises to ~1 and falls.
                target = rewards + (1.5 if i >= 40 else 0.0) * model.target_net(states).max(1)[0].sign()
            loss = nn.functional.mse_loss(q, target)
            watch.log(loss=loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert watch.ledger_path is not None
    return records(watch.ledger_path)


def test_a_q_networks_loss_is_not_taken_for_a_classifiers_at_chance(run_root: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "gymnasium", types.ModuleType("gymnasium"))  # the example imports gym
    ledger = _train(run_root)
    assert ledger[0]["rules"] == {"loss-spike": False, "grad-explosion": False, "loss-chance": False}
    steps = [r for r in ledger if r["kind"] == "step"]
    # The Q-values and the actions read as 2 classes and their labels (from step 2, the first with the parts hooked)
    assert [(s["step"], s["classes"]) for s in steps if s.get("classes")] == [(2, 2)]
    assert [r for r in ledger if r["kind"] == "alert"] == []
    # The same run with loss-chance on, as it ran before: "back to chance" at the target network's sync.
    again = _train(run_root, rules={"loss-chance": True})
    assert [(r["rule"], r["step"], r["severity"]) for r in again if r["kind"] == "alert"] == [
        ("loss-chance", 40, "warning")
    ]
