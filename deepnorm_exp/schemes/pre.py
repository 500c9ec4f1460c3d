"""Pre-LN (Xiong et al., 2020): x_{l+1} = x_l + G(LN(x_l)), and one LN on the stack's output."""

from __future__ import annotations

from torch import nn

from . import register
from .base import NormedConfig, NormScheme


class PreNormResidual(nn.Module):
    """x + G(LN(x)): the residual stream itself is never normalized."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm

    def forward(self, x, *args, **kwargs):
        return x + self.sublayer(self.norm(x), *args, **kwargs)


@register("pre")
class PreLN(NormScheme):
    Config = NormedConfig

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return PreNormResidual(sublayer, self.norm(sublayer.d_model))

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return self.norm(d_model)
