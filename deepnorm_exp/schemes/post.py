"""Post-LN (Vaswani et al., 2017): x_{l+1} = LN(alpha * x_l + G(x_l)), with alpha = 1.

`PostNorm` is the structure, which DeepNorm and Admin build on; `PostLN` (`norm=post`) is the paper's
baseline: that structure, initialised as its codebase did (`norm.init`, schemes/base.py: BaselineInit).
"""

from __future__ import annotations

from torch import nn

from . import register
from .base import BaselineConfig, BaselineInit, NormedConfig, NormScheme


class PostNormResidual(nn.Module):
    """LN(alpha * x + G(x)): the norm sits after the residual sum."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, alpha: float = 1.0):
        super().__init__()
        self.sublayer, self.norm, self.alpha = sublayer, norm, alpha

    def forward(self, x, *args, **kwargs):
        return self.norm(self.alpha * x + self.sublayer(x, *args, **kwargs))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.6g}"


class PostNorm(NormScheme):
    Config = NormedConfig

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return PostNormResidual(sublayer, self.norm(sublayer.d_model), self.residual_multiplier(stack))


@register("post")
class PostLN(BaselineInit, PostNorm):
    Config = BaselineConfig
