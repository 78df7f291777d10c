"""``seed_everything``: python, numpy, torch and loader workers seeded, and said so in the run record."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tuiwatch


def test_seed_everything_seeds_python_numpy_torch_and_workers(tmp_path: Path, socket_dir: Path):
    import numpy

    def draw() -> tuple[float, float, float, list[int]]:
        seeded = tuiwatch.seed_everything(123)
        data = TensorDataset(torch.arange(16))
        loader = DataLoader(
            data,
            batch_size=4,
            shuffle=True,
            num_workers=2,
            generator=seeded.generator,
            worker_init_fn=seeded.worker_init_fn,
        )
        order = [int(i) for (b,) in loader for i in b]
        return random.random(), float(numpy.random.rand()), float(torch.rand(1)), order  # noqa: S311

    assert draw() == draw()
    model = torch.nn.Linear(2, 2)
    watch = tuiwatch.Watch(model, run_dir=tmp_path, system=False)
    watch.close()
    assert watch.run_record["seed"] == 123
    seeding = watch.run_record["seeding"]
    assert seeding is not None
    assert seeding["numpy"] is True
    assert seeding["deterministic"] is False


def test_deterministic_mode_turns_on_deterministic_algorithms_and_says_so(capsys: pytest.CaptureFixture[str]):
    try:
        tuiwatch.seed_everything(5, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert "deterministic algorithms on" in capsys.readouterr().err
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    with pytest.raises(ValueError, match="needs an integer seed"):
        tuiwatch.seed_everything(-1)
