"""Deterministic batches: seeded epoch permutations of the training sequences."""

from __future__ import annotations

from typing import Iterator

import torch


def random_batches(tokens: torch.Tensor, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless batches; every sequence is used once per epoch, the order fixed by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(tokens.shape[0], generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield tokens[order[start:start + batch_size]]
