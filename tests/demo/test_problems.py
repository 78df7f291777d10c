"""The demo problems' data: what their loaders give."""

from __future__ import annotations

import torch

from tuiwatch.demo.problems import batched, loader, separable


def test_batched_gives_the_row_by_row_loaders_batches_in_its_order_every_epoch():
    # 300 rows: the last batch of each epoch is short (44 rows), as the row-by-row loader's is.
    def data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
        g = torch.Generator().manual_seed(seed)
        x, y = separable(300, g)
        return x, y, g

    rows_by_row, by_index = loader(*data(3)), batched(*data(3))
    epochs = [(list(rows_by_row), list(by_index)) for _ in range(3)]
    for old, new in epochs:
        assert [len(b[0]) for b in new] == [64, 64, 64, 64, 44]
        assert all(torch.equal(a, b) for o, n in zip(old, new, strict=True) for a, b in zip(o, n, strict=True))
    assert not torch.equal(epochs[0][1][0][0], epochs[1][1][0][0])  # shuffled again each epoch
