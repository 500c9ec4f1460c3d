"""Which parameters belong to which residual block, so per-layer norms cost one foreach call each.

A model lists its residual blocks bottom to top (`model.residual_blocks()`: stack, layer, sublayer name,
block); every parameter inside a block (sublayer, its norms, the scheme's own scalars) counts for that
block. Parameters outside every block (embeddings, final norms) count only in the global figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class BlockIndex:
    stacks: list[str]
    layers: list[int]
    sublayers: list[str]
    blocks: list[nn.Module]

    @classmethod
    def of(cls, model: nn.Module) -> "BlockIndex":
        rows = list(model.residual_blocks())
        return cls(*(list(column) for column in zip(*rows))) if rows else cls([], [], [], [])

    def __len__(self) -> int:
        return len(self.blocks)

    def columns(self) -> dict[str, np.ndarray]:
        """The index as table columns; `position` counts blocks bottom to top across all stacks."""
        return {"stack": np.array(self.stacks), "layer": np.array(self.layers, dtype=np.int32),
                "sublayer": np.array(self.sublayers), "position": np.arange(len(self), dtype=np.int32)}


def squared_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """||t||^2 of each tensor, as one float32 vector; one fused kernel per dtype/device group.

    FSDP's sharded tensors (DTensors, each rank a shard along dim 0) give the whole tensor's norms: the
    shards' squared norms summed over the ranks, a collective every rank makes at the same step."""
    if not tensors:
        return torch.zeros(0)
    mesh = getattr(tensors[0], "device_mesh", None)
    if mesh is not None:
        local = [t.to_local() for t in tensors]
        squared = torch.stack(torch._foreach_norm(local)).float().square()
        torch.distributed.all_reduce(squared, group=mesh.get_group())
        return squared
    # torch._foreach_norm is what torch.nn.utils.get_total_norm and the foreach optimizers use.
    return torch.stack(torch._foreach_norm(tensors)).float().square()


class ParamBlocks:
    """The trainable parameters in a fixed order, each tagged with its block's position (-1: no block)."""

    def __init__(self, model: nn.Module, index: BlockIndex):
        owner = {}
        for position, block in enumerate(index.blocks):
            for p in block.parameters():
                owner[p] = position
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.n_blocks = len(index)
        self.block_of = torch.tensor([owner.get(p, -1) for p in self.params], dtype=torch.long)
        self._in_block = self.block_of >= 0

    def per_block(self, squared: torch.Tensor) -> torch.Tensor:
        """Per-parameter squared norms (in `params` order) -> the L2 norm of each block, (n_blocks,)."""
        squared = squared.cpu()
        sums = torch.zeros(self.n_blocks).index_add_(0, self.block_of[self._in_block], squared[self._in_block])
        return sums.sqrt()

    def grads(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The gradients that exist, and which parameters (indices into `params`) they belong to."""
        present = [i for i, p in enumerate(self.params) if p.grad is not None]
        return [self.params[i].grad for i in present], torch.tensor(present, dtype=torch.long)
