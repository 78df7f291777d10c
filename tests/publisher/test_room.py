"""The update norm's copy of the weights never runs a training out of memory."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from tuiwatch.publisher import room
from tuiwatch.publisher.hooks import ModelHooks
from tuiwatch.publisher.watch import Watch

from ..helpers import records
from .loops import train_step


def test_a_copy_fits_when_it_takes_at_most_half_the_spare_memory_of_its_device():
    small = [torch.zeros(1000), torch.zeros(10, dtype=torch.float64)]
    assert room.has_room(small)
    # A view as large as 1.5 x the host's available memory (expand allocates nothing): its copy would not fit.
    available = psutil.virtual_memory().available
    huge = torch.zeros(1).expand(int(1.5 * available) // 4)
    assert room.spare_bytes(torch.device("cpu")) == pytest.approx(available, rel=0.2)
    assert not room.has_room([huge])
    assert not room.has_room([*small, huge])
    # A device that cannot say how much is spare (meta holds no data): the copy is made, as before.
    assert room.spare_bytes(torch.device("meta")) is None
    assert room.has_room([torch.empty(10**12, device="meta")])


def test_a_sample_without_room_is_not_taken_and_the_run_goes_on_without_a_false_alarm(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(room, "SHARE", 0.0)  # no copy fits: as on a device the run has filled
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watch(model, optimizer, run_dir=run_root, system=False, quiet=True, update_norm_every=1) as watch:
        for _ in range(40):
            train_step(watch, model, optimizer)
    assert watch.ledger_path is not None
    steps = records(watch.ledger_path, "step")
    assert len(steps) == 40
    assert all(s["update_norm"] is None for s in steps)
    assert [s["opt_step"] for s in steps if s["param_norm"] is not None] == [1, 11, 21, 31]
    assert [a["rule"] for a in records(watch.ledger_path, "alert")] == []


def test_a_copy_whose_allocation_fails_all_the_same_skips_the_sample_and_never_raises(
    monkeypatch: pytest.MonkeyPatch,
):
    # Spare memory can be too fragmented for one large block: the allocation then fails inside the optimizer's
    # pre-hook, which would raise out of the user's optimizer.step().
    monkeypatch.setattr(room, "SHARE", 1e9)  # the check lets any copy through
    huge = torch.zeros(1).expand(10**13).requires_grad_()  # 40 TB of float32 to copy, none held
    hooks = ModelHooks.__new__(ModelHooks)
    hooks._kept_snapshot = None
    assert hooks._snapshot([huge]) is None
    small = nn.Parameter(torch.ones(3))
    taken = hooks._snapshot([small, nn.Parameter(torch.ones(2), requires_grad=False)])
    assert taken is not None
    assert taken[0] == [small]  # only what can move
    assert torch.equal(taken[1][0], torch.ones(3))
