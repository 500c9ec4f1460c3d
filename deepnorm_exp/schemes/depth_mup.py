"""Depth-muP (Yang et al., 2023, "Tensor Programs VI: Feature Learning in Infinite-Depth Neural Networks";
Bordelon et al., 2023): residual branches scaled by 1/sqrt(L), here on Pre-LN:
x_{l+1} = x_l + G(LN(x_l)) / sqrt(L), L the stack's layers. `norm.lr_rule=true` adds the Adam
learning-rate rule for transfer across depth: every parameter inside a residual block trains at
lr * sqrt(base_depth / L) (embeddings and the final norm keep lr), so an lr tuned at `norm.base_depth`
layers transfers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from ..errors import ConfigError
from . import register
from .base import NormedConfig
from .branch import BranchScaledResidual
from .pre import PreNorm


@dataclass
class DepthMuPConfig(NormedConfig):
    name: str = "depth_mup"
    lr_rule: bool = False  # each block's learning rate x sqrt(base_depth / L)
    base_depth: int = 1  # the depth the learning rate was tuned at (lr_rule only)

    def __post_init__(self):
        super().__post_init__()
        if self.base_depth <= 0:
            raise ConfigError("base_depth", self.base_depth, "must be a positive integer")


@register("depth_mup")
class DepthMuP(PreNorm):
    Config = DepthMuPConfig
    cfg: DepthMuPConfig

    def alpha(self, stack: str) -> float:  # reported as alpha: the branch multiplier
        return 1.0 / math.sqrt(self.depths[stack])

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return BranchScaledResidual(sublayer, self.norm(sublayer.d_model), self.alpha(stack), learnable=False)

    def block_lr_factor(self, stack: str) -> float:
        return math.sqrt(self.cfg.base_depth / self.depths[stack])

    def param_groups(self, model: nn.Module, lr: float) -> list[dict] | None:
        if not self.cfg.lr_rule:
            return None
        groups, seen = {}, set()
        for stack, _, _, block in model.residual_blocks():
            for p in block.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    groups.setdefault(stack, []).append(p)
        rest = [p for p in model.parameters() if id(p) not in seen]
        return [{"params": rest, "lr": lr}] + [{"params": ps, "lr": lr * self.block_lr_factor(stack)}
                                               for stack, ps in groups.items()]
