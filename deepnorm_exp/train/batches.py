"""Deterministic batches: seeded epoch permutations of the training examples, resumable mid-epoch."""

from __future__ import annotations

from typing import Iterator

import torch


class RandomBatches:
    """Endless batches of every tensor's rows; each example is used once per epoch, the order fixed by `seed`.

    `state_dict()` is the generator's state at the start of the current epoch plus the position in it, so a
    resumed run draws exactly the batches an uninterrupted one would have.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        # tensors, or any rows indexable by an index tensor (memory-mapped data.packing.TokenBlocks)
        self.tensors, self.batch_size = tensors, batch_size
        # Data parallelism: every rank draws the same global batch and takes its own contiguous share, so the
        # run sees the same examples at every world size (and a checkpoint resumes at another one).
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} does not split over {world_size} ranks")
        share = batch_size // world_size
        self.rows = slice(rank * share, (rank + 1) * share)
        self.n = len(next(iter(tensors.values())))
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch_start_state: torch.Tensor | None = None
        self.order: torch.Tensor | None = None
        self.position = 0

    def _new_epoch(self) -> None:
        self.epoch_start_state = self.generator.get_state()
        self.order = torch.randperm(self.n, generator=self.generator)
        self.position = 0

    def __iter__(self) -> "RandomBatches":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.order is None or self.position + self.batch_size > self.n:
            self._new_epoch()
        index = self.order[self.position:self.position + self.batch_size][self.rows]
        self.position += self.batch_size
        return {name: t[index] for name, t in self.tensors.items()}

    def state_dict(self) -> dict:
        return {"epoch_start_state": self.epoch_start_state, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if state["epoch_start_state"] is not None:
            self.generator.set_state(state["epoch_start_state"])
            self._new_epoch()
            self.position = state["position"]


def sequential_batches(tensors: dict[str, torch.Tensor], batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """Every example once, in order (evaluation)."""
    n = next(iter(tensors.values())).shape[0]
    for start in range(0, n, batch_size):
        yield {name: t[start:start + batch_size] for name, t in tensors.items()}
