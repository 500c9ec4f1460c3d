"""Pre-LN (Xiong et al., 2020): x_{l+1} = x_l + G(LN(x_l)), and one LN on the stack's output.

`PreNorm` is the structure, which Sub-LN, Peri-LN, LayerNorm Scaling, SkipInit and depth-muP build on;
`PreLN` (`norm=pre`) is the paper's baseline: that structure, initialised as its codebase did (`norm.init`,
schemes/base.py: BaselineInit).
"""

from __future__ import annotations

from torch import nn

from . import register
from .base import BaselineConfig, BaselineInit, NormedConfig, NormScheme


class PreNormResidual(nn.Module):
    """x + G(LN(x)): the residual stream itself is never normalized."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm

    def forward(self, x, *args, **kwargs):
        return x + self.sublayer(self.norm(x), *args, **kwargs)


class PreNorm(NormScheme):
    Config = NormedConfig

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return PreNormResidual(sublayer, self.norm(sublayer.d_model))

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return self.norm(d_model)


@register("pre")
class PreLN(BaselineInit, PreNorm):
    Config = BaselineConfig
