"""Data a benchmark's model can learn, so that a watched run is a healthy one, as a user's is.

Random labels keep a model at chance: ``loss-chance`` fires at step 199 and stays active, and the publisher
thread then pays for an alert's episode on every record (on the tiny MLP 6.9 µs of diagnosis a record
against 5.5 on the same model learning). A benchmark on such data measures a run no user has.
"""

from __future__ import annotations

import torch


def teacher_labels(x: torch.Tensor, classes: int, generator: torch.Generator, noise: float = 0.1) -> torch.Tensor:
    """Labels of a random linear teacher over ``x``'s rows, a ``noise`` share of them flipped at random."""
    teacher = torch.randn(x[0].numel(), classes, generator=generator)
    y = (x.flatten(1) @ teacher).argmax(1)
    flipped = torch.rand(len(y), generator=generator) < noise
    return torch.where(flipped, torch.randint(0, classes, (len(y),), generator=generator), y)


def counting_tokens(rows: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Token rows that count up from a random start (modulo ``vocab``): a language model learns the next one."""
    start = torch.randint(0, vocab, (rows, 1), generator=generator)
    return (start + torch.arange(length)) % vocab
