"""A base for schemes that change only the init or the weights and apply to Post-LN or Pre-LN alike."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..config import setting
from .base import NormedConfig, NormScheme
from .post import PostNormResidual
from .pre import PreNormResidual


BASES = ("post", "pre")


@dataclass
class PostOrPreConfig(NormedConfig):
    base: str = setting("pre", choices=BASES)  # post | pre


class PostOrPre(NormScheme):
    """Post-LN's or Pre-LN's residual blocks and final norm, as `norm.base` says."""

    cfg: PostOrPreConfig

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        cls = PostNormResidual if self.cfg.base == "post" else PreNormResidual
        return cls(sublayer, self.norm(sublayer.d_model))

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return self.norm(d_model) if self.cfg.base == "pre" else nn.Identity()
