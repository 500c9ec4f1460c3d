"""Mix-LN (Li et al., 2024, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and
Post-LN"): Post-LN in the first layers of each stack, Pre-LN in the rest (and Pre-LN's final LN).
`norm.post_layers` sets how many; null takes `norm.post_fraction` (0.25) of the stack, rounded down."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from ..errors import ConfigError
from . import register
from .base import NormedConfig, NormScheme
from .post import PostNormResidual
from .pre import PreNormResidual


@dataclass
class MixLNConfig(NormedConfig):
    name: str = "mixln"
    post_layers: Optional[int] = None  # Post-LN layers at the bottom of each stack (null: post_fraction of it)
    post_fraction: float = 0.25  # the share of each stack in Post-LN when post_layers is null

    def __post_init__(self):
        super().__post_init__()
        if self.post_layers is not None and self.post_layers < 0:
            raise ConfigError("post_layers", self.post_layers, "must be >= 0, or null for post_fraction")
        if not 0.0 <= self.post_fraction <= 1.0:
            raise ConfigError("post_fraction", self.post_fraction, "must be in [0, 1]")


@register("mixln")
class MixLN(NormScheme):
    Config = MixLNConfig
    cfg: MixLNConfig

    def post_layers(self, stack: str) -> int:
        layers = self.depths[stack]
        wanted = self.cfg.post_layers if self.cfg.post_layers is not None else int(self.cfg.post_fraction * layers)
        return min(wanted, layers)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        if layer < self.post_layers(stack):
            return PostNormResidual(sublayer, self.norm(sublayer.d_model))
        return PreNormResidual(sublayer, self.norm(sublayer.d_model))

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return self.norm(d_model) if self.post_layers(stack) < self.depths[stack] else nn.Identity()
