"""Deterministic batches: seeded epoch permutations of the training examples."""

from __future__ import annotations

from typing import Iterator

import torch


def random_batches(tensors: dict[str, torch.Tensor], batch_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches of every tensor's rows; each example is used once per epoch, the order fixed by `seed`."""
    n = next(iter(tensors.values())).shape[0]
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - batch_size + 1, batch_size):
            index = order[start:start + batch_size]
            yield {name: t[index] for name, t in tensors.items()}


def sequential_batches(tensors: dict[str, torch.Tensor], batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """Every example once, in order (evaluation)."""
    n = next(iter(tensors.values())).shape[0]
    for start in range(0, n, batch_size):
        yield {name: t[start:start + batch_size] for name, t in tensors.items()}
